"""extract_features.py: HuggingFace's hidden states of a real checkpoint, the original's JSON
format, pair splitting and truncation, streaming in chunks, and input errors."""

import functools
import json
import os
import resource
import signal

import numpy as np
import pytest

from conftest import (SHARED, VOCAB, WIKITEXT, import_script, minilm_dir, requires_shared,
                      run_script)

from bert_tf2 import fileio
from bert_tf2 import sliding_windows
from bert_tf2 import tokenization

REFERENCE = os.path.join(SHARED, "reference", "minilm_hf_reference.npz")


_import_script = import_script


@pytest.fixture(scope="module")
def ef():
  return _import_script("extract_features")


def _unknown_character(tokenizer):
  """A CJK character the vocabulary lacks (it tokenizes to [UNK]), to stand for [UNK]."""
  for code in range(0x4E00, 0x9FFF):
    if tokenizer.tokenize(chr(code)) == ["[UNK]"]:
      return chr(code)
  raise AssertionError("every CJK character is in the vocabulary")


def _reference_lines(reference, tokenizer):
  """The reference inputs as `a ||| b` lines: the ids decode to WordPiece tokens, which joined
  (## pieces glued back) give texts that tokenize to the same ids again."""
  unknown = _unknown_character(tokenizer)
  lines, expected = [], []
  for case in ("single", "pair", "unicode"):
    for row in range(2):
      n = int(reference[f"{case}/attention_mask"][row].sum())
      ids = reference[f"{case}/input_ids"][row][:n].tolist()
      tokens = tokenizer.convert_ids_to_tokens(ids)
      segments = reference[f"{case}/token_type_ids"][row][:n]
      first_sep = tokens.index("[SEP]")
      texts = [" ".join(unknown if t == "[UNK]" else t for t in part).replace(" ##", "")
               for part in (tokens[1:first_sep], tokens[first_sep + 1:-1])]
      if not texts[1]:
        assert not segments.any()
        lines.append(texts[0])
      else:
        assert segments[first_sep + 1:].all() and not segments[:first_sep + 1].any()
        lines.append(f"{texts[0]} ||| {texts[1]}")
      expected.append((case, row, tokens))
  return lines, expected


@requires_shared
@pytest.mark.parametrize("padding", ["--dynamic_padding", "--nodynamic_padding"])
def test_every_layer_matches_huggingface_hidden_states(tmp_path, padding):
  """All six layers of the MiniLM checkpoint for the reference inputs (English, a question /
  answer pair, accents / CJK / [UNK]) agree with HF's outputs at every token to 2e-5 (the bound
  tests/test_modeling.py holds the encoder to) plus 5e-7 for the 6-decimal rounding of the
  output format (measured: 3e-6); the features are the reference's tokens exactly."""
  model_dir = minilm_dir()
  reference = np.load(REFERENCE)
  tokenizer = tokenization.FullTokenizer(os.path.join(model_dir, "vocab.txt"), True)
  lines, expected = _reference_lines(reference, tokenizer)
  input_file = tmp_path / "input.txt"
  input_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
  output_file = tmp_path / "features.jsonl"
  layers = [-1, -2, -3, -4, -5, -6]
  # batch 4 over 6 lines: the last batch is padded.
  result = run_script(["extract_features.py", f"--input_file={input_file}", f"--output_file={output_file}",
                 f"--init_checkpoint={model_dir}", f"--vocab_file={model_dir}/vocab.txt",
                 "--max_seq_length=48", "--batch_size=4",
                 "--layers=" + ",".join(str(i) for i in layers), padding])
  assert result.returncode == 0, result.stderr[-3000:]
  outputs = [json.loads(line) for line in output_file.read_text(encoding="utf-8").splitlines()]
  assert [o["linex_index"] for o in outputs] == list(range(6))
  worst = 0.0
  for output, (case, row, tokens) in zip(outputs, expected):
    assert [f["token"] for f in output["features"]] == tokens
    hidden = reference[f"{case}/all_hidden_states"][:, row]  # [7, 48, 384]: embeddings + 6
    for position, feature in enumerate(output["features"]):
      assert [layer["index"] for layer in feature["layers"]] == layers
      for layer in feature["layers"]:
        want = hidden[7 + layer["index"], position]
        diff = np.abs(np.array(layer["values"]) - want).max()
        worst = max(worst, diff)
  print(f"largest difference from HF: {worst:.2e}")
  assert worst < 2.05e-5, worst


@requires_shared
def test_google_tf1_checkpoint_with_its_config_beside_it(tmp_path):
  """A checkpoint prefix in the original format: bert_config.json and vocab.txt are found beside
  it, the default --layers are the last four of its two layers (-3 and -4 do not exist: an
  error), and the values are that model's hidden states."""
  from bert_tf2 import checkpoints  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  directory = os.path.join(SHARED, "data", "checkpoints", "tiny_tf1_test_checkpoint")
  prefix = os.path.join(directory, "bert_model.ckpt")
  input_file = tmp_path / "input.txt"
  input_file.write_text("all work and no play ||| makes jack a dull boy\n", encoding="utf-8")
  output_file = tmp_path / "out.jsonl"
  common = [f"--input_file={input_file}", f"--output_file={output_file}",
            f"--init_checkpoint={prefix}", f"--vocab_file={directory}/vocab.txt",
            "--max_seq_length=16"]
  result = run_script(["extract_features.py"] + common)
  assert result.returncode == 2
  assert "--layers: -3 is not a layer of a 2-layer model" in result.stderr
  # Without --vocab_file: the vocab.txt beside the checkpoint, as the other scripts find it.
  result = run_script(["extract_features.py"] + common[:3] + ["--max_seq_length=16",
                                                               "--layers=-1,0"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"--vocab_file: {directory}/vocab.txt (beside --init_checkpoint)" in result.stderr
  (output,) = [json.loads(line) for line in output_file.read_text(encoding="utf-8").splitlines()]
  tokens = ["[CLS]", "all", "work", "and", "no", "play", "[SEP]", "makes", "jack", "a", "dull",
            "boy", "[SEP]"]
  assert [f["token"] for f in output["features"]] == tokens

  config = modeling.BertConfig.from_json_file(os.path.join(directory, "bert_config.json"))
  model = modeling.BertModel(config)
  checkpoints.init_from_checkpoint(model, prefix, require_all=True)
  vocab = tokenization.FullTokenizer(os.path.join(directory, "vocab.txt"), True)
  ids = np.array([vocab.convert_tokens_to_ids(tokens)])
  layers = model(ids, np.ones_like(ids), np.array([[0] * 7 + [1] * 6]))["encoder_outputs"]
  for position, feature in enumerate(output["features"]):
    for layer, want in zip(feature["layers"], (layers[-1], layers[0])):
      np.testing.assert_allclose(layer["values"], want.numpy()[0, position], atol=2e-6, rtol=0)


def test_rounding_is_pythons_round_to_6_decimals(ef):
  rng = np.random.default_rng(0)
  values = np.concatenate([
      rng.normal(0, 3, 20000).astype(np.float32),
      # float32 values as close as they get to a 7th-decimal 5 (rounding ties and near-ties).
      ((np.arange(-5000, 5000) + 0.5) / 1e6).astype(np.float32),
      np.array([0.0, -0.0, 1e-7, -4e-7, 5e-7, 123456.5, -2.5e-6], np.float32)])
  assert ef.rounded(values) == [round(float(v), 6) for v in values]


def test_split_line_and_features(ef, tmp_path):
  assert ef.split_line("  who wrote it ? ||| devlin et al .  ") == ("who wrote it ?",
                                                                   "devlin et al .")
  # The last separator splits, as the original's greedy pattern did.
  assert ef.split_line("a ||| b ||| c") == ("a ||| b", "c")
  assert ef.split_line("no separator|||here") == ("no separator|||here", None)
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "d",
                              "e", "##s"]) + "\n", encoding="utf-8")
  tokenizer = tokenization.FullTokenizer(str(vocab), True)
  features = ef.convert_lines_to_features(
      [(0, "a b c d e ||| a"), (1, "A Bs"), (2, ""), (3, "a b c d e a b c ||| b c d")], 8,
      tokenizer)
  assert features[0].tokens == ["[CLS]", "a", "b", "c", "d", "[SEP]", "a", "[SEP]"]
  assert features[0].input_type_ids == [0] * 6 + [1] * 2
  assert features[1].tokens == ["[CLS]", "a", "b", "##s", "[SEP]"]
  assert features[1].input_mask == [1] * 5 + [0] * 3 and features[1].input_ids[5:] == [0] * 3
  assert features[2].tokens == ["[CLS]", "[SEP]"]
  # The longer text loses tokens first: 8 - 3 = 5 tokens left, split 3 / 2.
  assert features[3].tokens == ["[CLS]", "a", "b", "c", "[SEP]", "b", "c", "[SEP]"]


def _small_extractor(ef):
  """(uncased tokenizer, a small random LayerExtractor of layers -1 and 0, its Trainer)."""
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  config = modeling.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=32,
                               max_position_embeddings=32, type_vocab_size=2)
  tf.random.set_seed(1)
  model = ef.LayerExtractor(config, [-1, 0])
  return (tokenization.FullTokenizer(VOCAB, True), model,
          training.Trainer(tf.distribute.get_strategy(), model, loss_fn=None))


@requires_shared
def test_streams_in_chunks_and_matches_one_chunk(ef, tmp_path, monkeypatch):
  """Input read a few lines at a time gives the same output as in one piece."""
  tokenizer, _, trainer = _small_extractor(ef)
  input_file = tmp_path / "input.txt"
  input_file.write_text("the man went to the store .\nhe bought milk ||| and bread\n\n"
                        "a b c\nlast line\n", encoding="utf-8")
  chunk_sizes = []
  convert = ef.convert_lines_to_features

  def spy(lines, *args):
    chunk_sizes.append(len(lines))
    return convert(lines, *args)

  monkeypatch.setattr(ef, "convert_lines_to_features", spy)
  run_orders = []  # the line ids of each window, in the order the model ran them
  predict = trainer.predict

  def predict_spy(*args):
    run_orders.append([])
    for outputs in predict(*args):
      run_orders[-1].extend(i for i in outputs["unique_ids"].tolist() if i >= 0)
      yield outputs

  monkeypatch.setattr(trainer, "predict", predict_spy)
  outputs, orders = {}, {}
  # (lines per chunk in batches, values held at once, batches sorted by length and cut): two
  # lines per chunk, or 96 values = three tokens of 2 layers x 16 per window, i.e. one line each.
  for setting in ((1, 2**20, False), (64, 2**20, False), (64, 2**20, True), (64, 96, True)):
    batches_per_chunk, held, pad_to_longest = setting
    monkeypatch.setattr(ef, "_BATCHES_PER_CHUNK", batches_per_chunk)
    monkeypatch.setattr(ef, "_MAX_HELD_VALUES", held)
    path = tmp_path / "out.jsonl"
    with open(path, "w", encoding="utf-8") as writer:
      assert ef.extract(trainer, tokenizer, [-1, 0], str(input_file), writer, 16, 2,
                        pad_to_longest=pad_to_longest) == 5
    outputs[setting] = path.read_text(encoding="utf-8")
    orders[setting], run_orders[:] = list(run_orders), []
  assert chunk_sizes == [2, 2, 1, 5, 5, 5]
  # The lines have 9, 8, 2, 5 and 4 tokens.
  assert orders[(1, 2**20, False)] == [[0, 1], [2, 3], [4]]
  assert orders[(64, 2**20, False)] == [[0, 1, 2, 3, 4]]
  assert orders[(64, 2**20, True)] == [[2, 4, 3, 1, 0]]
  assert orders[(64, 96, True)] == [[0], [1], [2], [3], [4]]
  assert outputs[(1, 2**20, False)] == outputs[(64, 2**20, False)]
  lines = [json.loads(line) for line in outputs[(1, 2**20, False)].splitlines()]
  assert [line["linex_index"] for line in lines] == [0, 1, 2, 3, 4]
  # Written back in input order whatever the window and the order they ran in: the same tokens, values equal up to the float error of shorter batches.
  for setting in ((64, 2**20, True), (64, 96, True)):
    other = [json.loads(line) for line in outputs[setting].splitlines()]
    assert [line["linex_index"] for line in other] == [0, 1, 2, 3, 4]
    for line, line_other in zip(lines, other):
      assert [f["token"] for f in line["features"]] == [f["token"] for f in line_other["features"]]
      np.testing.assert_allclose(
          [[layer["values"] for layer in f["layers"]] for f in line["features"]],
          [[layer["values"] for layer in f["layers"]] for f in line_other["features"]],
          atol=1e-5)
  assert len(lines[0]["features"][0]["layers"][1]["values"]) == 16


@requires_shared
def test_input_errors(tmp_path):
  model_dir = minilm_dir()
  base = [f"--init_checkpoint={model_dir}", f"--vocab_file={model_dir}/vocab.txt",
          f"--output_file={tmp_path / 'out.jsonl'}"]
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine line\nbroken \xff line\n")
  result = run_script(["extract_features.py"] + base + [f"--input_file={bad}"])
  assert result.returncode == 2
  assert f"{bad}:2: invalid UTF-8" in result.stderr
  assert not (tmp_path / "out.jsonl").exists()
  good = tmp_path / "good.txt"
  good.write_text("hello\n", encoding="utf-8")
  result = run_script(["extract_features.py"] + base + [f"--input_file={good}", "--layers=-1,6"])
  assert result.returncode == 2 and "--layers: 6 is not a layer of a 6-layer model" in result.stderr


def _direct_windows(tokens_a, tokens_b, seq_length, stride):
  """(line tokens, [(window tokens, [(line position, window position)])]) of a line too long for
  one sequence, computed here without the script's code: windows over the windowed text (text_b
  of a pair, else text_a) start at 0, stride, 2 * stride, ... until one reaches its end; each of
  its tokens comes from the window where min(left, right context) + 0.01 * window length is
  largest (the first on a tie), [CLS] a [SEP] from the first window, the last [SEP] from the
  last."""
  a, b = list(tokens_a), list(tokens_b)
  budget = seq_length - (3 if b else 2)
  if b:
    tokenization.truncate_seq_pair(a, list(b), budget)
    head, text, size = ["[CLS]", *a, "[SEP]"], b, budget - len(a)
  else:
    head, text, size = ["[CLS]"], a, budget
  starts = [k * stride for k in range(1 + -(-(len(text) - size) // stride))]
  lengths = [min(size, len(text) - start) for start in starts]

  def score(k, t):
    return min(t - starts[k], starts[k] + lengths[k] - 1 - t) + 0.01 * lengths[k]

  best = [max((k for k in range(len(starts)) if starts[k] <= t < starts[k] + lengths[k]),
              key=lambda k: (score(k, t), -k)) for t in range(len(text))]
  windows = []
  for k, (start, length) in enumerate(zip(starts, lengths)):
    tokens = head + text[start:start + length] + ["[SEP]"]
    sources = [(len(head) + t, len(head) + t - start) for t in range(start, start + length)
               if best[t] == k]
    if k == 0:
      sources += [(i, i) for i in range(len(head))]
    if k == len(starts) - 1:
      sources.append((len(head) + len(text), len(tokens) - 1))
    windows.append((tokens, sources))
  return head + text + ["[SEP]"], windows


@pytest.mark.slow
@requires_shared
def test_doc_stride_takes_each_token_from_its_max_context_window(ef, tmp_path):
  """Real WikiText lines several times longer than one sequence (single texts and pairs) with
  --doc_stride: one output line per input line holding every token, each token's vectors those
  of the window where it has the most context, run here directly through the model; lines that
  fit in one window give exactly the output without --doc_stride."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tokenizer, model, trainer = _small_extractor(ef)
  seq_length, stride = 24, 7
  texts = [line.strip() for _, line in fileio.read_lines(WIKITEXT) if line.strip()]
  long = [t for t in texts if 60 < len(tokenizer.tokenize(t)) < 120][:6]
  short = [t for t in texts if len(tokenizer.tokenize(t)) <= seq_length - 3][:5]
  lines = long[:3] + [f"{short[0]} ||| {long[3]}", f"{long[4]} ||| {long[5]}"] + short[1:]

  def extract(lines, doc_stride):
    input_file = tmp_path / "input.txt"
    input_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path = tmp_path / "out.jsonl"
    with open(path, "w", encoding="utf-8") as writer:
      assert ef.extract(trainer, tokenizer, [-1, 0], str(input_file), writer, seq_length, 3,
                        pad_to_longest=True, doc_stride=doc_stride) == len(lines)
    return path.read_text(encoding="utf-8")

  outputs = [json.loads(line) for line in extract(lines, stride).splitlines()]
  assert [o["linex_index"] for o in outputs] == list(range(len(lines)))
  for line, output in zip(lines[:5], outputs):
    text_a, text_b = ef.split_line(line)
    tokens, windows = _direct_windows(tokenizer.tokenize(text_a),
                                      tokenizer.tokenize(text_b) if text_b else [], seq_length,
                                      stride)
    assert len(windows) >= 3
    assert [f["token"] for f in output["features"]] == tokens
    got = np.array([[layer["values"] for layer in f["layers"]] for f in output["features"]])
    covered = []
    for window_tokens, sources in windows:
      ids = tokenizer.convert_tokens_to_ids(window_tokens)
      types = [0] * len(window_tokens)
      if text_b:
        types[window_tokens.index("[SEP]") + 1:] = [1] * (len(window_tokens)
                                                         - window_tokens.index("[SEP]") - 1)
      layers = model({"input_ids": tf.constant([ids]), "input_mask": tf.ones([1, len(ids)],
                                                                             tf.int32),
                      "input_type_ids": tf.constant([types])})["layers"][0].numpy()
      for line_position, window_position in sources:
        np.testing.assert_allclose(got[line_position], layers[:, window_position], atol=1e-5,
                                   rtol=0)
        covered.append(line_position)
    assert sorted(covered) == list(range(len(tokens)))
  # Lines that fit: the very output of a run without windows.
  assert extract(short, stride) == extract(short, None)


@requires_shared
def test_doc_stride_command_line(tmp_path):
  """extract_features.py --doc_stride with the tiny TF1 checkpoint: a line four windows long comes
  out as one JSON line with every token, beside a short one; a stride that leaves windows without
  overlap is one error line and writes nothing."""
  directory = os.path.join(SHARED, "data", "checkpoints", "tiny_tf1_test_checkpoint")
  words = "all work and no play makes jack a dull boy".split()
  long = " ".join(words * 4)
  input_file = tmp_path / "input.txt"
  input_file.write_text(f"{long}\njack ||| {long}\nall work\n", encoding="utf-8")
  output_file = tmp_path / "out.jsonl"
  common = ["extract_features.py", f"--input_file={input_file}", f"--output_file={output_file}",
            f"--init_checkpoint={directory}/bert_model.ckpt", f"--vocab_file={directory}/vocab.txt",
            "--max_seq_length=16", "--layers=-1"]
  result = run_script(common + ["--doc_stride=14"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "error: --doc_stride=14 must be below the 14 text tokens of a window (--max_seq_length=16 "
      "- 2 for [CLS] text [SEP]), or windows would not overlap")
  assert not output_file.exists()
  result = run_script(common + ["--doc_stride=6"])
  assert result.returncode == 0, result.stderr[-3000:]
  outputs = [json.loads(line) for line in output_file.read_text(encoding="utf-8").splitlines()]
  assert [[f["token"] for f in o["features"]] for o in outputs] == [
      ["[CLS]", *words * 4, "[SEP]"], ["[CLS]", "jack", "[SEP]", *words * 4, "[SEP]"],
      ["[CLS]", "all", "work", "[SEP]"]]
  assert all(len(f["layers"][0]["values"]) == 4 for o in outputs for f in o["features"])
  # A pair at --max_seq_length=4 has a budget of one token: truncation keeps it for text_a and
  # leaves no window for text_b. Windows of no token never advanced (the run grew without
  # bound); now the pair is cut as without --doc_stride, [CLS] a [SEP] as the original writes
  # it. The timeout and a data limit far above the run's needs (it fits in under 1 GiB) make a
  # regression fail within a minute rather than hang or fill the machine's memory.
  input_file.write_text("jack jack ||| jack jack\nall work\n", encoding="utf-8")
  limit = lambda: resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))
  texts = []
  for stride in (["--doc_stride=1"], []):
    result = run_script([*common, "--max_seq_length=4", *stride], timeout=180, preexec_fn=limit)
    assert result.returncode == 0, result.stderr[-3000:]
    texts.append(output_file.read_text(encoding="utf-8"))
  assert texts[0] == texts[1]
  assert [[f["token"] for f in json.loads(line)["features"]] for line in texts[0].splitlines()] == [
      ["[CLS]", "jack", "[SEP]"], ["[CLS]", "all", "work", "[SEP]"]]


def _within(seconds, call):
  """call(), failed with TimeoutError after `seconds`: a window loop that never advances fails
  the test instead of hanging it (SIGALRM interrupts Python code in the main thread)."""
  def expire(*_):
    raise TimeoutError(f"still running after {seconds} s")
  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(seconds)
  try:
    return call()
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_windows_of_no_token_are_refused():
  """spans() refuses windows of no token or a stride of none (the loop would never advance);
  sequence_windows reads a pair that leaves text_b no window token as one truncated window."""
  for max_tokens, stride in ((0, 1), (-1, 1), (1, 0)):
    with pytest.raises(ValueError, match="at least 1"):
      _within(5, functools.partial(sliding_windows.spans, 2, max_tokens, stride))
  pair = (["jack", "jack"], ["jack", "jack"])
  for doc_stride in (1, None):
    windows = _within(5, functools.partial(sliding_windows.sequence_windows, *pair, 4, doc_stride))
    assert windows == (["jack"], [], [sliding_windows.Span(0, 1)])
  a, b, spans = sliding_windows.sequence_windows(*pair, 4, 1)
  assert sliding_windows.window_tokens(a, b, spans[0]) == (["[CLS]", "jack", "[SEP]"], [0, 0, 0])
  # The smallest budget that windows text_b (run_classifier's least for a pair, --max_seq_length=5):
  # one token of each, text_b read whole a token at a time.
  a, b, spans = _within(5, functools.partial(sliding_windows.sequence_windows, ["x", "y"],
                                             ["p", "q", "r"], 5, 1))
  assert [sliding_windows.window_tokens(a, b, s)[0] for s in spans] == [
      ["[CLS]", "x", "[SEP]", t, "[SEP]"] for t in ("p", "q", "r")]


ST_REFERENCE = os.path.join(SHARED, "reference", "minilm_sentence_embeddings.npz")


@requires_shared
def test_sentence_embeddings_equal_sentence_transformers(tmp_path):
  """`--pooling=mean --normalize --max_seq_length=256` with the packaged all-MiniLM-L6-v2 gives
  sentence-transformers' encode(..., normalize_embeddings=True) for 305 real and awkward lines
  (Unicode, empty, blank, an 800-token line cut to 256, special tokens written as text, read as
  HF reads them with --nosplit_special_tokens) within 1e-5, and without --normalize its mean
  pooling; cls and max pool the per-token output's own vectors."""
  model_dir = minilm_dir()
  reference = np.load(ST_REFERENCE)
  sentences = [str(s) for s in reference["sentences"]]
  assert int(reference["max_seq_length"]) == 256
  input_file = tmp_path / "sentences.txt"
  input_file.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
  common = [f"--input_file={input_file}", f"--init_checkpoint={model_dir}",
            f"--vocab_file={model_dir}/vocab.txt", "--max_seq_length=256",
            "--nosplit_special_tokens"]
  runs = {"normalized": ["--pooling=mean", "--normalize"], "mean_pooled": ["--pooling=mean"]}
  for name, flags in runs.items():
    out = tmp_path / f"{name}.jsonl"
    result = run_script(["extract_features.py", *common, f"--output_file={out}", *flags])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["linex_index"] for r in rows] == list(range(len(sentences)))
    ours = np.array([r["embedding"] for r in rows])
    worst = np.abs(ours - reference[name]).max(axis=1)
    print(f"{name}: largest difference from sentence-transformers {worst.max():.2e}")
    assert worst.max() < 1e-5, (np.argmax(worst), sentences[int(np.argmax(worst))][:80])
  norms = np.linalg.norm(np.array([json.loads(l)["embedding"] for l in
                                   (tmp_path / "normalized.jsonl").read_text().splitlines()]), axis=1)
  assert np.allclose(norms, 1, atol=1e-5)

  # cls and max: the [CLS] vector and the element-wise maximum of the per-token output.
  few = tmp_path / "few.txt"
  few.write_text("".join(s + "\n" for s in sentences[:3] + sentences[300:302]), encoding="utf-8")
  common[0] = f"--input_file={few}"
  result = run_script(["extract_features.py", *common, f"--output_file={tmp_path}/tokens.jsonl",
                       "--layers=-1"])
  assert result.returncode == 0, result.stderr[-3000:]
  tokens = [np.array([f["layers"][0]["values"] for f in json.loads(line)["features"]])
            for line in (tmp_path / "tokens.jsonl").read_text().splitlines()]
  for pooling, pool in (("cls", lambda t: t[0]), ("max", lambda t: t.max(0))):
    out = tmp_path / f"{pooling}.jsonl"
    result = run_script(["extract_features.py", *common, f"--output_file={out}",
                         f"--pooling={pooling}"])
    assert result.returncode == 0, result.stderr[-3000:]
    for line, vectors in zip(out.read_text().splitlines(), tokens):
      np.testing.assert_allclose(json.loads(line)["embedding"], pool(vectors), atol=2e-6)


def test_pooling_flags_are_checked(tmp_path):
  """--normalize without --pooling, --pooling with several --layers or with --doc_stride: one
  error line each, before any model is built."""
  words = tmp_path / "words.txt"
  words.write_text("all work and no play\n")
  tiny = os.path.join(SHARED, "data", "checkpoints", "tiny_tf1_test_checkpoint")
  common = ["extract_features.py", f"--input_file={words}", f"--output_file={tmp_path}/o.jsonl",
            f"--init_checkpoint={tiny}/bert_model.ckpt", f"--vocab_file={tiny}/vocab.txt",
            "--max_seq_length=16"]
  for flags, message in (
      (["--normalize"], "--normalize scales sentence vectors: give --pooling too"),
      (["--pooling=mean", "--layers=-1,-2"], "--pooling=mean pools one layer, but --layers="),
      (["--pooling=max", "--doc_stride=4"], "--doc_stride with --pooling=max"),
  ):
    result = run_script([*common, *flags])
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: " + message), result.stderr
  assert not os.path.exists(tmp_path / "o.jsonl")
