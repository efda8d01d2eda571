"""export_model.py: SavedModels that reload through TF Hub and equal the in-process model, and
in-graph preprocessing equal to tokenization.FullTokenizer on the real corpora."""

import collections
import importlib
import json
import os
import random
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from conftest import (PYTHON, ROOT, SHARED, SQUAD, TINY, VOCAB, corpus_texts, import_script,
                      minilm_dir, requires_shared, run_ok, run_process, run_script)
from bert_tf2 import checkpoints
from bert_tf2 import classifier_tasks
from bert_tf2 import export_model
from bert_tf2 import fileio
from bert_tf2 import graph_tokenization
from bert_tf2 import modeling
from bert_tf2 import tokenization

GLUE = os.path.join(SHARED, "data", "glue")
SMALL_CONFIG = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=128, type_vocab_size=2)

# Characters where tokenizers tend to differ (see tests/test_tokenization.py for why each).
EDGE_TEXTS = [
    "", "   ", "Héllo wörld", "HeLLo!how  \n Are yoU?", "你好世界", "ah\u535a\u63a8zz",
    "a\x00b\ufffd\x07c d\te\n", "I \u2764\ufe0f NY 🙂!", "$5.00 isn't 50%!", "x" * 201,
    "y" * 200, "straße … ½ º", "İstanbul ΟΔΟΣ ΣΑΣ ﬁne Σ ΑΣ. Α'Σ", "a\u2028b\u2029c",
    "a\u200db\ufeffc", "e\u0301t\u00e9", "«¿Qué?» —dijo", "\u3000全角\u3000スペース",
    "UNwant\u00e9d,running", "\uf900\U0002f800 compat", "ᾼ ǅ Ⅻ ⓐ",
]


def _import_hub():
  try:
    return importlib.import_module("tensorflow_hub")
  except ModuleNotFoundError as e:
    if e.name != "pkg_resources":
      raise
    # tensorflow_hub 0.16 checks the TF version with pkg_resources.parse_version, and setuptools
    # 82 dropped pkg_resources; give it the same function from `packaging` (pin setuptools<81
    # in requirements.txt to make this unnecessary).
    from packaging import version  # pylint: disable=g-import-not-at-top
    sys.modules["pkg_resources"] = types.SimpleNamespace(parse_version=version.parse)
    return importlib.import_module("tensorflow_hub")


def _real_texts():
  """Every WikiText-2 line, every SQuAD v1.1 dev context and question, and the edge texts."""
  return corpus_texts() + EDGE_TEXTS


def _random_texts(count, seed):
  """Random strings mixing ASCII, the edge texts' characters and any code point, some as bytes
  with invalid UTF-8 (the reference drops undecodable bytes)."""
  rng = random.Random(seed)
  pool = "".join(EDGE_TEXTS)
  texts = []
  for i in range(count):
    chars = []
    for _ in range(rng.randint(0, 30)):
      r = rng.random()
      if r < 0.35:
        chars.append(rng.choice(pool))
      elif r < 0.6:
        chars.append(chr(rng.randint(0x20, 0x7E)))
      elif r < 0.8:
        chars.append(chr(rng.randint(0, 0x3000)))
      else:
        cp = rng.randint(0, 0x10FFFF)
        chars.append(chr(cp) if not 0xD800 <= cp <= 0xDFFF else "Σ")
    text = "".join(chars).encode("utf-8")
    if i % 5 == 0:
      text += bytes([rng.randint(0x80, 0xFF)]) + b"ok"
    texts.append(text)
  return texts


def _ragged_rows(ragged):
  """[batch, (words), (pieces)] or [batch, (pieces)] -> list of id lists per row."""
  if ragged.ragged_rank > 1:
    ragged = ragged.merge_dims(1, 2)
  values, splits = ragged.flat_values.numpy().tolist(), ragged.row_splits.numpy().tolist()
  return [values[a:b] for a, b in zip(splits, splits[1:])]


def _tokenize_all(fn, texts, batch=4096):
  rows = []
  for i in range(0, len(texts), batch):
    rows.extend(_ragged_rows(fn(tf.constant(texts[i:i + batch]))))
  return rows


def _mismatches(tokenizer, texts, got):
  expected = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t)) for t in texts]
  return [(texts[i], expected[i], got[i]) for i in range(len(texts)) if expected[i] != got[i]]


@pytest.fixture(scope="module")
def hub():
  return _import_hub()


@pytest.fixture(scope="module")
def preprocessor_dir(tmp_path_factory):
  return export_model.export("preprocessor", str(tmp_path_factory.mktemp("pre") / "model"),
                             vocab_file=VOCAB, do_lower_case=True, max_seq_length=128)


# --- preprocessing ----------------------------------------------------------------------------


@pytest.mark.slow
@requires_shared
def test_preprocessing_savedmodel_equals_full_tokenizer_on_real_corpora(preprocessor_dir,
                                                                        uncased):
  loaded = tf.saved_model.load(preprocessor_dir)
  texts = _real_texts()
  assert len(texts) > 15000
  got = _tokenize_all(loaded.tokenize, texts)
  assert _mismatches(uncased, texts, got) == []
  # The word axis holds BasicTokenizer's words.
  words = loaded.tokenize(tf.constant(["Héllo, wörld!"]))
  assert words.to_list() == [[uncased.convert_tokens_to_ids(uncased.tokenize(w))
                              for w in ("hello", ",", "world", "!")]]


@pytest.mark.slow
@requires_shared
def test_cased_and_random_text_preprocessing_equal_full_tokenizer():
  texts = _real_texts()[::3] + _random_texts(3000, seed=5)
  for lower in (True, False):
    module = graph_tokenization.TextPreprocessor(VOCAB, lower)
    got = _tokenize_all(tf.function(module.tokenize_text), texts)
    assert _mismatches(tokenization.FullTokenizer(VOCAB, lower), texts, got) == []


def test_character_tables_follow_the_reference_rules():
  tables = graph_tokenization.character_tables(True)
  mapping = {int(k): tables.values[o:o + n].tolist()
             for k, o, n in zip(tables.keys, tables.offsets, tables.lengths)}
  assert mapping[ord("A")] == [ord("a")]
  assert mapping[ord("é")] == [ord("e")]
  assert mapping[ord("!")] == [32, ord("!"), 32]
  assert mapping[ord("\t")] == [32] and mapping[0x2028] == [32]
  assert ord("ß") not in mapping  # Lower-casing keeps it (NFKC case folding would give "ss").
  assert mapping[0xF900] == [32, 0x8C48, 32]  # A CJK compatibility ideograph, decomposed.
  inside = lambda cp, ranges: bool(graph_tokenization._in_ranges(tf.constant([cp]), ranges).numpy()[0])
  assert inside(0, tables.drop) and inside(0x200D, tables.drop) and not inside(32, tables.drop)
  assert inside(ord("A"), tables.cased) and not inside(ord("1"), tables.cased)
  assert inside(ord("'"), tables.case_ignorable) and inside(0x301, tables.case_ignorable)


@pytest.mark.slow
@requires_shared
def test_packing_equals_run_classifier_features(preprocessor_dir, uncased, hub):
  run_classifier = import_script("run_classifier")
  processor = classifier_tasks.get_processor("mrpc")
  pairs = processor.get_dev_examples(os.path.join(GLUE, "MRPC"))[:200]
  singles = classifier_tasks.get_processor("sst-2").get_dev_examples(
      os.path.join(GLUE, "SST-2"))[:200]
  loaded = tf.saved_model.load(preprocessor_dir)
  pack = hub.KerasLayer(loaded.bert_pack_inputs, arguments=dict(seq_length=24))
  for examples, two in ((pairs, True), (singles, False)):
    text_a = tf.constant([e.text_a for e in examples])
    text_b = tf.constant([e.text_b or "" for e in examples])
    for seq_length in (128, 24):
      if seq_length == 128:
        got = (loaded.signatures["pairs"](text_a=text_a, text_b=text_b) if two
               else loaded.signatures["serving_default"](text=text_a))
      else:
        segments = [loaded.tokenize(text_a)] + ([loaded.tokenize(text_b)] if two else [])
        got = pack(segments)
      for i, example in enumerate(examples):
        want = run_classifier.convert_single_example(
            i + 10, example, processor.get_labels(), seq_length, uncased)
        assert got["input_word_ids"][i].numpy().tolist() == want.input_ids
        assert got["input_mask"][i].numpy().tolist() == want.input_mask
        assert got["input_type_ids"][i].numpy().tolist() == want.segment_ids


def test_pair_truncation_closed_form_equals_popping(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(tokenization.SPECIAL_TOKENS) + "\na\nb\n", encoding="utf-8")
  module = graph_tokenization.TextPreprocessor(str(vocab), True)
  lengths = [(a, b) for a in range(0, 13) for b in range(0, 13)]
  a = tf.ragged.constant([[5] * la for la, _ in lengths], dtype=tf.int32, ragged_rank=1)
  b = tf.ragged.constant([[6] * lb for _, lb in lengths], dtype=tf.int32, ragged_rank=1)
  for seq_length in (3, 4, 5, 8, 11, 16):
    got = module.pack([a, b], seq_length)["input_word_ids"].numpy()
    for i, (la, lb) in enumerate(lengths):
      tokens_a, tokens_b = [5] * la, [6] * lb
      if tokens_b:
        tokenization.truncate_seq_pair(tokens_a, tokens_b, seq_length - 3)
      else:
        tokens_a = tokens_a[:seq_length - 2]
      row = got[i].tolist()
      assert row.count(5) == len(tokens_a) and row.count(6) == len(tokens_b), (la, lb, seq_length)


# --- encoder ----------------------------------------------------------------------------------


def _encoder_inputs(seed, batch, seq, vocab_size):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab_size, size=(batch, seq)).astype(np.int32)
  lengths = rng.integers(2, seq + 1, size=batch)
  mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
  types = ((np.arange(seq)[None, :] >= lengths[:, None] // 2) & (mask > 0)).astype(np.int32)
  return dict(input_word_ids=ids * mask, input_mask=mask, input_type_ids=types)


def _assert_same_tokens(got, want, real):
  # The SavedModel's graphs and the in-process tf.function are optimised separately (grappler's
  # oneDNN remapper may fuse matmul + bias + GELU in one and not the other): they agree as closely
  # as this model agrees with HuggingFace's: real tokens to 2e-5, padding (which nothing reads)
  # to 1e-4 (relative, too: MiniLM has a few features above 1 in every layer).
  got, want = np.asarray(got), np.asarray(want)
  np.testing.assert_allclose(got[real], want[real], atol=2e-5, rtol=0)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@requires_shared
@pytest.mark.parametrize("source", ["tiny_tf1", "minilm"])
def test_encoder_reloads_through_hub_equal_to_in_process_model(source, hub, tmp_path):
  if source == "tiny_tf1":
    checkpoint, lower = os.path.join(TINY, "bert_model.ckpt"), True
  else:
    checkpoint, lower = minilm_dir(), True
  path = export_model.export("encoder", str(tmp_path / "encoder"), init_checkpoint=checkpoint,
                             do_lower_case=lower)
  config, _, vocab = export_model.find_config_and_vocab(checkpoint)
  holder = checkpoints.EncoderHolder(config, name="holder")
  checkpoints.init_from_checkpoint(holder, checkpoint, require_all=True)

  layer = hub.KerasLayer(path, trainable=True)
  loaded = hub.load(path)
  # The in-process model in a tf.function, as the SavedModel runs it: the same graph.
  in_process = tf.function(lambda x: holder.bert(x["input_word_ids"], x["input_mask"],
                                                 x["input_type_ids"]))
  for seed, (batch, seq) in enumerate([(2, 5), (3, 16)]):
    inputs = _encoder_inputs(seed, batch, seq, config.vocab_size)
    want = in_process(inputs)
    got = layer(inputs)
    signature = loaded.signatures["serving_default"](
        **{k: tf.constant(v) for k, v in inputs.items()})
    real = inputs["input_mask"].astype(bool)
    for outputs in (got, signature):
      np.testing.assert_allclose(outputs["pooled_output"], want["pooled_output"], atol=1e-5,
                                 rtol=0)
      _assert_same_tokens(outputs["sequence_output"], want["sequence_output"], real)
    assert len(got["encoder_outputs"]) == config.num_hidden_layers
    for i in range(config.num_hidden_layers):
      for outputs in (got, signature):
        _assert_same_tokens(outputs["encoder_outputs"][i], want["encoder_outputs"][i], real)
  # Fine-tunable through Keras: every encoder weight is a trainable weight of the layer, under
  # its original checkpoint name; dropout is on only when training.
  names = sorted(v.name for v in layer.trainable_weights)
  assert names == sorted(v.name for v in holder.bert.trainable_variables)
  assert "bert/encoder/layer_0/attention/self/query/kernel:0" in names
  inputs = _encoder_inputs(0, 2, 5, config.vocab_size)
  assert not np.allclose(layer(inputs, training=True)["sequence_output"],
                         layer(inputs, training=False)["sequence_output"])
  # Tokenization info, as TF Hub BERT models carry it.
  with open(loaded.vocab_file.asset_path.numpy().decode(), encoding="utf-8") as f, \
       open(vocab, encoding="utf-8") as g:
    assert f.read() == g.read()
  assert bool(loaded.do_lower_case.numpy()) is lower
  assert modeling.BertConfig.from_json_file(
      os.path.join(path, "assets", "bert_config.json")) == config


# --- fine-tuned models ------------------------------------------------------------------------


def _fine_tuned(tmp_path, model, name):
  """Writes `model` as this project's training loop does (tf.train.Checkpoint, model=...)."""
  directory = tmp_path / name
  directory.mkdir()
  tf.train.Checkpoint(model=model).write(str(directory / "ckpt-1"))
  with open(directory / "bert_config.json", "w", encoding="utf-8") as f:
    f.write(model.bert.config.to_json_string())
  return str(directory / "ckpt-1")


def _features(features):
  return {"input_ids": tf.constant([f.input_ids for f in features]),
          "input_mask": tf.constant([f.input_mask for f in features]),
          "segment_ids": tf.constant([f.segment_ids for f in features])}


@pytest.mark.slow
@requires_shared
def test_classifier_serves_raw_text_like_the_in_process_model(tmp_path, uncased, hub):
  run_classifier = import_script("run_classifier")
  tf.random.set_seed(1)
  model = modeling.BertClassifier(modeling.BertConfig(**SMALL_CONFIG), 2)
  checkpoint = _fine_tuned(tmp_path, model, "mrpc")
  path = export_model.export("classifier", str(tmp_path / "classifier"),
                             init_checkpoint=checkpoint, vocab_file=VOCAB, max_seq_length=64,
                             labels=["different", "paraphrase"], text_pairs=True)
  examples = classifier_tasks.get_processor("mrpc").get_dev_examples(
      os.path.join(GLUE, "MRPC"))[:48]
  features = [run_classifier.convert_single_example(10, e, ["0", "1"], 64, uncased)
              for e in examples]
  probabilities = tf.nn.softmax(model(_features(features))["logits"]).numpy()

  loaded = tf.saved_model.load(path)
  got = loaded.signatures["serving_default"](
      text_a=tf.constant([e.text_a for e in examples]),
      text_b=tf.constant([e.text_b for e in examples]))
  np.testing.assert_allclose(got["probabilities"], probabilities, atol=1e-5, rtol=0)
  assert got["label_id"].numpy().tolist() == probabilities.argmax(-1).tolist()
  names = np.array(["different", "paraphrase"])[probabilities.argmax(-1)].tolist()
  assert [x.decode() for x in got["label"].numpy()] == names
  # Single sentences: the `single` signature, __call__ and hub.KerasLayer agree.
  single = [run_classifier.InputExample("s", e.text_a, None, "0") for e in examples[:8]]
  want = tf.nn.softmax(model(_features(
      [run_classifier.convert_single_example(10, e, ["0", "1"], 64, uncased)
       for e in single]))["logits"]).numpy()
  text = tf.constant([e.text_a for e in single])
  np.testing.assert_allclose(loaded.signatures["single"](text_a=text)["probabilities"], want,
                             atol=1e-5, rtol=0)
  np.testing.assert_allclose(hub.KerasLayer(path)(text)["probabilities"], want, atol=1e-5, rtol=0)


@requires_shared
def test_squad_model_answers_as_run_squad_over_every_window(tmp_path, uncased):
  """SQuAD v1.1 dev questions whose contexts take two to ten windows at --max_seq_length=96: the
  SavedModel's answers are run_squad.py's predictions (predictions.json) from the same
  checkpoint, its scores the start + end logits of run_squad's best answers, and a good part of
  them come from a window after the first."""
  run_squad = import_script("run_squad")
  tf.random.set_seed(2)
  config = modeling.BertConfig(**SMALL_CONFIG)
  checkpoint = str(tmp_path / "model" / "bert_model.ckpt")
  checkpoints.export_tf1_checkpoint(modeling.BertSpanLabeler(config), checkpoint, config, VOCAB)
  seq_length, max_query, max_answer, stride = 96, 24, 10, 32
  with open(SQUAD, encoding="utf-8") as f:
    data = json.load(f)
  data["data"] = data["data"][:3]
  for article in data["data"]:
    # Contexts longer than a window holds with no question at all: several windows each.
    article["paragraphs"] = [p for p in article["paragraphs"]
                             if len(uncased.tokenize(p["context"])) > seq_length - 3][:6]
    for paragraph in article["paragraphs"]:
      paragraph["qas"] = paragraph["qas"][:3]
  predict_file = tmp_path / "dev.json"
  predict_file.write_text(json.dumps(data), encoding="utf-8")
  out = tmp_path / "out"
  # A small n-best: the best start and end logits often make no valid span, and candidates
  # outside the n best starts or ends must be passed over as run_squad does.
  flags = [f"--max_seq_length={seq_length}", f"--max_query_length={max_query}",
           f"--max_answer_length={max_answer}", f"--doc_stride={stride}", "--n_best_size=4"]
  run_ok(["run_squad.py", f"--vocab_file={VOCAB}", f"--init_checkpoint={checkpoint}",
          f"--output_dir={out}", f"--predict_file={predict_file}", "--do_predict", *flags])
  predictions = json.loads((out / "predictions.json").read_text(encoding="utf-8"))
  nbest = json.loads((out / "nbest_predictions.json").read_text(encoding="utf-8"))
  path = str(tmp_path / "squad_model")
  run_ok(["export_model.py", "--model_type=squad", f"--init_checkpoint={checkpoint}",
          f"--export_dir={path}", *flags])

  examples = run_squad.read_squad_examples(str(predict_file), is_training=False)
  features = []
  run_squad.convert_examples_to_features(examples, uncased, seq_length, stride, max_query, False,
                                         features.append)
  windows = collections.Counter(f.example_index for f in features)
  assert len(examples) == 49 and min(windows.values()) >= 2 and max(windows.values()) == 10
  serve = tf.saved_model.load(path).signatures["serving_default"]
  got = serve(question=tf.constant([e.question_text for e in examples]),
              context=tf.constant([" ".join(e.doc_tokens) for e in examples]))
  answers = [a.decode("utf-8") for a in got["answer"].numpy()]
  # Where no span is valid run_squad writes its placeholder "empty"; the SavedModel answers "",
  # in window -1.
  none = [nbest[e.qas_id] == [{"text": "empty", "probability": 1.0, "start_logit": 0.0,
                               "end_logit": 0.0}] for e in examples]
  assert 0 < sum(none) < len(examples) / 4
  assert answers == ["" if no_span else predictions[e.qas_id]
                     for e, no_span in zip(examples, none)]
  assert (got["window"].numpy() == -1).tolist() == none
  np.testing.assert_allclose(
      got["score"], [nbest[e.qas_id][0]["start_logit"] + nbest[e.qas_id][0]["end_logit"]
                     for e in examples], atol=1e-4, rtol=0)
  assert np.mean(got["window"].numpy() > 0) > 0.25
  assert any(a not in [" ".join(e.doc_tokens[i:j]) for i in range(len(e.doc_tokens))
                       for j in range(i + 1, min(i + 12, len(e.doc_tokens)) + 1)]
             for a, e in zip(answers, examples))  # parts of words, as run_squad cuts them
  # No question at all: an empty batch of each output, of the types a full one has (zero windows
  # once failed a -1 reshape in the model).
  empty = serve(question=tf.constant([], tf.string), context=tf.constant([], tf.string))
  assert {k: (v.shape.as_list(), v.dtype) for k, v in empty.items()} == {
      k: ([0], v.dtype) for k, v in got.items()}


@pytest.mark.slow
@requires_shared
def test_final_text_is_run_squads_projection_on_the_context(uncased):
  """The in-graph get_final_text equals run_squad's span_text on 3,000 random spans of SQuAD dev
  windows (spans starting or ending inside words, accents, punctuation inside words)."""
  run_squad = import_script("run_squad")
  examples = run_squad.read_squad_examples(SQUAD, is_training=False)[::35]
  features = []
  run_squad.convert_examples_to_features(examples, uncased, 128, 64, 32, False, features.append)
  rng = random.Random(7)
  pieces, orig, want = [], [], []
  for feature in rng.sample(features, 600):
    example = examples[feature.example_index]
    positions = sorted(feature.token_to_orig_map)
    for _ in range(5):
      start = rng.choice(positions)
      end = min(start + rng.randrange(10), positions[-1])
      pieces.append(feature.tokens[start:end + 1])
      orig.append(" ".join(example.doc_tokens[feature.token_to_orig_map[start]:
                                              feature.token_to_orig_map[end] + 1]))
      want.append(run_squad.span_text(example, feature, start, end, True))
  preprocessor = graph_tokenization.TextPreprocessor(VOCAB, True)
  got = tf.function(lambda p, o: export_model.final_text(preprocessor, p, o))(
      tf.ragged.constant(pieces), tf.constant(orig))
  got = [text.decode("utf-8") for text in got.numpy()]
  assert [(p, o, w, g) for p, o, w, g in zip(pieces, orig, want, got) if w != g] == []
  cut = sum(w != o for w, o in zip(want, orig))
  assert 300 < cut < 2700, cut  # both projections (part of the words) and the words whole


# --- command line, saved_model_cli, fine-tuning from a module ---------------------------------


def _saved_model_cli():
  """TensorFlow's saved_model_cli as a user runs it: the console script beside the interpreter,
  or its module where TensorFlow was installed without scripts (pip --target, as the GPU bundle
  of ../shared/gpu is)."""
  script = os.path.join(os.path.dirname(PYTHON), "saved_model_cli")
  return [script] if os.path.exists(script) else ["-m", "tensorflow.python.tools.saved_model_cli"]


@requires_shared
def test_command_line_export_and_saved_model_cli(tmp_path, preprocessor_dir):
  encoder = tmp_path / "encoder"
  run_ok(["export_model.py", "--model_type=encoder", f"--init_checkpoint={TINY}/bert_model.ckpt",
        f"--export_dir={encoder}"])
  result = run_ok([*_saved_model_cli(), "run",
                 f"--dir={encoder}", "--tag_set=serve", "--signature_def=serving_default",
                 "--input_exprs=input_word_ids=[[2,5,6,3]];input_mask=[[1,1,1,1]];"
                 "input_type_ids=[[0,0,0,0]]"])
  assert "Result for output key pooled_output" in result.stdout
  result = run_ok([*_saved_model_cli(), "run",
                 f"--dir={preprocessor_dir}", "--tag_set=serve", "--signature_def=pairs",
                 '--input_exprs=text_a=["Héllo!"];text_b=["Wörld"]'])
  # [CLS] hello ! [SEP] world [SEP] in the uncased vocab.
  assert "[[ 101 7592  999  102 2088  102    0" in result.stdout


@requires_shared
def test_run_classifier_fine_tunes_from_an_exported_encoder(tmp_path):
  tf.random.set_seed(3)
  holder = checkpoints.EncoderHolder(modeling.BertConfig(**SMALL_CONFIG), name="holder")
  pretrained = _fine_tuned(tmp_path, holder, "pretrained")
  encoder = export_model.export("encoder", str(tmp_path / "encoder"), init_checkpoint=pretrained,
                                vocab_file=VOCAB)
  data = tmp_path / "data"
  data.mkdir()
  rows = [line for _, line in fileio.read_lines(os.path.join(GLUE, "SST-2", "train.tsv"))][:17]
  for split in ("train", "dev"):
    with open(data / f"{split}.tsv", "w", encoding="utf-8") as f:
      f.write("\n".join(rows) + "\n")
  out = tmp_path / "out"
  common = ["run_classifier.py", "--task_name=tsv", f"--data_dir={data}",
            "--text_a_column=sentence", "--label_column=label", "--labels=0,1",
            f"--hub_module_handle={encoder}",
            f"--output_dir={out}", "--max_seq_length=32", "--train_batch_size=8",
            "--num_train_epochs=1", "--learning_rate=1e-30", "--do_train", "--do_eval"]
  run_ok(common)
  # With a negligible learning rate (zero is refused) the fine-tuned encoder is the module's.
  trained = modeling.BertClassifier(modeling.BertConfig(**SMALL_CONFIG), 2)
  report = checkpoints.init_from_checkpoint(trained, str(out))
  assert not report.missing
  for mine, theirs in zip(trained.bert.variables, holder.bert.variables):
    assert mine.name == theirs.name
    np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-20)
  assert os.path.exists(out / "eval_results.txt")
  # A casing that contradicts the module's is refused before anything runs.
  result = run_script(common + ["--nodo_lower_case"], timeout=300)
  assert result.returncode == 2 and "does not match the casing" in result.stderr


@requires_shared
@pytest.mark.parametrize("script", ["run_squad", "run_swag"])
def test_every_fine_tuning_script_starts_from_an_exported_encoder(script, tmp_path):
  """--hub_module_handle in run_squad and run_swag as in run_classifier (run_ner's test trains
  on CoNLL from one): the encoder's weights, config and vocab come from the SavedModel, and
  predicting with only an encoder (no task layer) is refused."""
  tf.random.set_seed(4)
  holder = checkpoints.EncoderHolder(modeling.BertConfig(**SMALL_CONFIG), name="holder")
  encoder = export_model.export("encoder", str(tmp_path / "encoder"),
                                init_checkpoint=_fine_tuned(tmp_path, holder, "pretrained"),
                                vocab_file=VOCAB)
  data = tmp_path / "data"
  data.mkdir()
  if script == "run_squad":
    with open(SQUAD, encoding="utf-8") as f:
      article = json.load(f)["data"][0]
    article["paragraphs"] = article["paragraphs"][:2]
    (data / "squad.json").write_text(json.dumps({"version": "1.1", "data": [article]}),
                                     encoding="utf-8")
    task = [f"--train_file={data / 'squad.json'}", f"--predict_file={data / 'squad.json'}",
            "--max_seq_length=96", "--doc_stride=32", "--max_query_length=24"]
    outputs = ["predictions.json", "nbest_predictions.json"]
  else:
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"
    row = ('0,v,1,"A man is on a ladder. He","A man is on a ladder.",He,gold,'
           "paints the wall.,jumps into a pool.,eats a cake.,drives away.")
    for name, label in (("train.csv", ",0"), ("val.csv", ",0"), ("test.csv", "")):
      (data / name).write_text(f"{header}{',label' if label else ''}\n" +
                               "".join(f"{row}{label}\n" for _ in range(4)), encoding="utf-8")
    task = [f"--data_dir={data}", "--max_seq_length=32", "--do_eval"]
    outputs = ["eval_results.txt", "test_results.tsv"]
  out = tmp_path / "out"
  common = [f"{script}.py", f"--hub_module_handle={encoder}", f"--output_dir={out}",
            "--train_batch_size=4", "--predict_batch_size=4", "--num_train_epochs=1",
            "--learning_rate=1e-30", "--do_predict", *task]
  refused = run_script(common)  # no --do_train: the encoder alone has no task layer
  assert refused.returncode == 2
  assert "is an encoder without this task's output layer" in refused.stderr.strip().splitlines()[-1]
  run_ok(common + ["--do_train"])
  for name in outputs:
    assert (out / name).stat().st_size > 0
  # With a negligible learning rate (zero is refused) the fine-tuned encoder is the module's.
  trained = checkpoints.EncoderHolder(modeling.BertConfig(**SMALL_CONFIG), name="holder")
  report = checkpoints.init_from_checkpoint(trained, str(out))
  assert not [n for n in report.missing if not n.startswith("bert/pooler/")]
  for mine, theirs in zip(trained.bert.variables, holder.bert.variables):
    assert mine.name == theirs.name
    np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-20)


# --- errors and atomic outputs ----------------------------------------------------------------


@pytest.mark.slow
@requires_shared
def test_export_replaces_atomically_and_reports_bad_inputs(tmp_path):
  target = str(tmp_path / "model")
  checkpoint = os.path.join(TINY, "bert_model.ckpt")
  export_model.export("encoder", target, init_checkpoint=checkpoint)
  before = os.path.getmtime(os.path.join(target, "saved_model.pb"))
  with pytest.raises(fileio.InputError, match="checkpoint not found"):
    export_model.export("encoder", target, init_checkpoint=str(tmp_path / "missing"),
                        bert_config_file=os.path.join(TINY, "bert_config.json"),
                        vocab_file=os.path.join(TINY, "vocab.txt"))
  with pytest.raises(fileio.InputError, match="not a fine-tuned classifier"):
    export_model.export("classifier", target, init_checkpoint=checkpoint, labels=["a", "b"],
                        max_seq_length=16)
  assert os.path.getmtime(os.path.join(target, "saved_model.pb")) == before
  assert sorted(os.listdir(tmp_path)) == ["model"]  # No temporary directory left behind.
  export_model.export("encoder", target, init_checkpoint=checkpoint)  # Replaces the old one.
  assert sorted(os.listdir(tmp_path)) == ["model"]
  tf.saved_model.load(target)
  with pytest.raises(fileio.InputError, match="vocab file"):
    export_model.export("preprocessor", target, vocab_file=str(tmp_path / "nope.txt"))


def _modes(directory):
  """{relative path: permission bits} of everything under `directory`, itself included."""
  modes = {".": os.stat(directory).st_mode & 0o7777}
  for root, dirs, files in os.walk(directory):
    for name in dirs + files:
      path = os.path.join(root, name)
      modes[os.path.relpath(path, directory)] = os.stat(path).st_mode & 0o7777
  return modes


@requires_shared
def test_export_dir_is_replaced_only_when_it_holds_a_saved_model(tmp_path):
  checkpoint = os.path.join(TINY, "bert_model.ckpt")
  target = tmp_path / "model"
  export_model.export("encoder", str(target), init_checkpoint=checkpoint)
  # Ordinary permissions (0755 / 0644 under umask 022), not mkdtemp's 0700: a serving process
  # under another user can read the model.
  umask = os.umask(0)
  os.umask(umask)
  modes = _modes(target)
  assert {"saved_model.pb", "variables", "assets/vocab.txt"} <= set(modes)
  for name, mode in modes.items():
    want = 0o777 & ~umask if os.path.isdir(target / name) else 0o666 & ~umask
    assert mode == want, (name, oct(mode))
  assert export_model.is_saved_model_directory(str(target))

  # A user's directory is refused untouched; --overwrite replaces it.
  foreign = tmp_path / "project"
  (foreign / "src").mkdir(parents=True)
  (foreign / "src" / "main.py").write_text("print(1)\n")
  with pytest.raises(fileio.InputError, match="does not hold an earlier output"):
    export_model.export("encoder", str(foreign), init_checkpoint=checkpoint)
  assert (foreign / "src" / "main.py").read_text() == "print(1)\n"
  export_model.export("encoder", str(foreign), init_checkpoint=checkpoint, overwrite=True)
  assert export_model.is_saved_model_directory(str(foreign))
  # A SavedModel with a user's file beside it is not ours alone any more.
  (target / "notes.txt").write_text("mine")
  assert not export_model.is_saved_model_directory(str(target))
  with pytest.raises(fileio.InputError, match="does not hold an earlier output"):
    export_model.export("encoder", str(target), init_checkpoint=checkpoint)
  assert (target / "notes.txt").read_text() == "mine"
  # A directory holding an input is refused even with overwrite.
  copy = tmp_path / "ckpt"
  copy.mkdir()
  for name in os.listdir(TINY):
    (copy / name).write_bytes((open(os.path.join(TINY, name), "rb").read()))
  with pytest.raises(fileio.InputError, match="holding the input --init_checkpoint"):
    export_model.export("encoder", str(copy), init_checkpoint=str(copy / "bert_model.ckpt"),
                        overwrite=True)
  assert sorted(os.listdir(copy)) == sorted(os.listdir(TINY))
  with pytest.raises(fileio.InputError, match="'a' is given twice"):
    export_model.export("classifier", str(tmp_path / "c"), init_checkpoint=checkpoint,
                        labels=["a", "b", "a"])
  with pytest.raises(fileio.InputError, match="too small for"):
    export_model.export("preprocessor", str(tmp_path / "p"), vocab_file=VOCAB, max_seq_length=2)
  assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


@requires_shared
def test_a_fine_tuning_run_exports_with_no_flag_repeated(tmp_path):
  """run_classifier.py leaves bert_config.json, vocab.txt and task.json (labels, text pairs, pooling)
  beside its checkpoints, and export_model.py reads them: --init_checkpoint=<output_dir> is
  enough. A --model_type the run did not train is refused."""
  config = modeling.BertConfig(**SMALL_CONFIG)
  pretrained = str(tmp_path / "pretrained" / "bert_model.ckpt")
  checkpoints.export_tf1_checkpoint(modeling.BertModel(config), pretrained, config, VOCAB)
  out = tmp_path / "mrpc"
  run_ok(["run_classifier.py", "--task_name=mrpc", f"--data_dir={GLUE}/MRPC",
          f"--vocab_file={VOCAB}", f"--init_checkpoint={pretrained}", f"--output_dir={out}",
          "--do_train", "--max_seq_length=32", "--train_batch_size=32",
          "--num_train_epochs=0.05"])
  assert modeling.BertConfig.from_json_file(str(out / "bert_config.json")) == config
  with open(VOCAB, "rb") as f:
    assert (out / "vocab.txt").read_bytes() == f.read()
  record = json.loads((out / "task.json").read_text(encoding="utf-8"))
  assert record == {"task": "run_classifier --task_name=mrpc", "labels": ["0", "1"],
                    "text_pairs": True, "regression": False, "multi_label": False,
                    "classifier_pooling": "pooler"}

  path = str(tmp_path / "served")
  run_ok(["export_model.py", "--model_type=classifier", f"--init_checkpoint={out}",
          f"--export_dir={path}", "--max_seq_length=32"])
  serve = tf.saved_model.load(path).signatures["serving_default"]
  assert sorted(serve.structured_input_signature[1]) == ["text_a", "text_b"]
  got = serve(text_a=tf.constant(["The cat sat."]), text_b=tf.constant(["A cat was sitting."]))
  assert got["probabilities"].shape == (1, 2) and got["label"].numpy()[0] in (b"0", b"1")

  refused = run_script(["export_model.py", "--model_type=squad", f"--init_checkpoint={out}",
                        f"--export_dir={tmp_path / 'squad'}"])
  assert refused.returncode == 2
  assert refused.stderr.strip().splitlines()[-1] == (
      f"error: --init_checkpoint={out} holds the model of run_classifier --task_name=mrpc, not "
      "of run_squad: no --model_type=squad")


@pytest.mark.slow
def test_squad_max_context_reads_neighbouring_windows_only_as_run_squad():
  """The SQuAD model's in-graph max-context choice (each window against the windows that can share
  a token with it, not every window of its context) picks, for every token of every window,
  exactly what run_squad's sliding_windows.max_context picks over all windows."""
  from bert_tf2 import sliding_windows  # pylint: disable=g-import-not-at-top
  rng = random.Random(7)
  seq_length = 40
  for doc_stride in (1, 3, 16, 64):
    query_lens = [rng.randint(1, 10) for _ in range(8)]
    doc_lens = [rng.choice([0, 1, 5, 30, 29, 200]) for _ in range(8)]
    example, index, start, length, count = export_model._context_windows(
        tf.constant(query_lens), tf.constant(doc_lens), seq_length, doc_stride)
    offset = tf.gather(tf.constant(query_lens), example) + 2
    in_window, best = export_model._max_context(example, index, start, length, count, offset,
                                                seq_length, -(-seq_length // doc_stride))
    want_in, want_best = np.zeros(in_window.shape, bool), np.zeros(best.shape, bool)
    for w, e in enumerate(example.numpy()):
      spans = sliding_windows.spans(doc_lens[e], seq_length - 3 - query_lens[e], doc_stride)
      for position in range(seq_length):
        token = position - int(offset[w])
        if 0 <= token < int(length[w]):
          want_in[w, position] = True
          want_best[w, position] = sliding_windows.max_context(
              spans, int(start[w]) + token) == int(index[w])
    np.testing.assert_array_equal(in_window.numpy(), want_in)
    np.testing.assert_array_equal(best.numpy(), want_best)


def test_squad_max_context_of_a_very_long_context_stays_small():
  """One context of 320,000 tokens (20,000 windows): the max-context choice must stay within a
  few hundred MB (it built windows x seq x windows tensors: ~200 GB here, killed or refused)."""
  code = """
import resource
import tensorflow as tf
from bert_tf2 import export_model
with open("/proc/self/status") as f:
  size = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + 3 * 2**30, resource.RLIM_INFINITY))
seq, stride, tokens = 64, 16, 320000
example, index, start, length, count = export_model._context_windows(
    tf.constant([5]), tf.constant([tokens]), seq, stride)
offset = tf.gather(tf.constant([5]), example) + 2
_, best = export_model._max_context(example, index, start, length, count, offset, seq,
                                    -(-seq // stride))
print(int(count[0]), int(tf.reduce_sum(tf.cast(best, tf.int32))))
"""
  result = run_script(["-c", code], timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  windows, chosen = map(int, result.stdout.split())
  assert windows > 5000
  assert chosen == 320000  # every token read in exactly one window: its max-context one


def test_embedder_saved_model_gives_sentence_transformers_vectors(tmp_path):
  """export_model.py --model_type=embedder --normalize from the packaged all-MiniLM-L6-v2: a
  SavedModel of raw strings -> sentence-transformers' normalized embeddings within 1e-5 (the
  lines with special tokens written as text excepted: the graph tokenizes as the original,
  splitting them, where HuggingFace reads them as tokens); its vectors are extract_features'
  --pooling ones for the same flags."""
  model_dir = minilm_dir()
  reference = np.load(os.path.join(SHARED, "reference", "minilm_sentence_embeddings.npz"))
  sentences = [str(s) for s in reference["sentences"]]
  keep = [i for i, s in enumerate(sentences)
          if not any(t in s for t in tokenization.SPECIAL_TOKENS)]
  assert len(keep) == len(sentences) - 1
  path = str(tmp_path / "embedder")
  run_ok(["export_model.py", "--model_type=embedder", f"--init_checkpoint={model_dir}",
          f"--export_dir={path}", "--max_seq_length=256", "--normalize"])
  embedder = tf.saved_model.load(path)
  vectors = np.concatenate([
      embedder.signatures["serving_default"](text=tf.constant([sentences[i] for i in part]))[
          "embedding"].numpy() for part in np.array_split(keep, 8)])
  assert vectors.shape == (len(keep), 384)
  worst = np.abs(vectors - reference["normalized"][keep]).max()
  print(f"embedder: largest difference from sentence-transformers {worst:.2e}")
  assert worst < 1e-5
  assert bool(embedder.normalized.numpy()) and embedder.pooling_name.numpy() == b"mean"
  # Refused: --normalize for another kind, a pooling the embedder does not have.
  for flags, message in ((["--model_type=encoder", "--normalize"], "--normalize is for"),
                         (["--model_type=embedder", "--pooling=none"], "--pooling=none: the")):
    result = run_script(["export_model.py", f"--init_checkpoint={model_dir}",
                         f"--export_dir={tmp_path / 'other'}", *flags], timeout=None)
    assert result.returncode == 2 and message in result.stderr.splitlines()[-1], result.stderr


@requires_shared
def test_query_model_prints_the_signatures_outputs_as_one_json_line(tmp_path):
  """query_model.py, the quiet way to query an export: one JSON line on stdout with the serving
  signature's outputs (an embedder's text input, an encoder's id inputs), no TensorFlow line on
  stderr (saved_model_cli prints ~16), and one error line for a wrong input name, a missing
  input, a value of the wrong type, a LiteRT directory or a directory without a SavedModel."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  embedder, encoder = str(tmp_path / "embedder"), str(tmp_path / "encoder")
  for model_type, directory in (("embedder", embedder), ("encoder", encoder)):
    export_model.export(model_type, directory, init_checkpoint=f"{TINY}/bert_model.ckpt",
                        vocab_file=f"{TINY}/vocab.txt", max_seq_length=16)
  text = "all work and no play makes jack a dull boy"
  ids = [[2, 5, 6, 7, 3, 0]]
  for directory, inputs, call in (
      (embedder, [f"--feed=text={text}"], dict(text=tf.constant([text]))),
      (encoder, [f"--feed=input_word_ids={ids}", "--feed=input_mask=[[1, 1, 1, 1, 1, 0]]",
                 "--feed=input_type_ids=[[0, 0, 0, 0, 0, 0]]"],
       dict(input_word_ids=tf.constant(ids, tf.int32),
            input_mask=tf.constant([[1, 1, 1, 1, 1, 0]], tf.int32),
            input_type_ids=tf.zeros([1, 6], tf.int32)))):
    result = run_process([PYTHON, "query_model.py", f"--export_dir={directory}", *inputs],
                         cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == "", result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout[-3000:]
    got = json.loads(lines[0])
    want = tf.saved_model.load(directory).signatures["serving_default"](**call)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
      np.testing.assert_allclose(np.array(got[name]), value.numpy(), rtol=1e-6, atol=1e-6)
  litert_dir = tmp_path / "litert"
  litert_dir.mkdir()
  (litert_dir / "model.tflite").write_bytes(b"x")
  (litert_dir / "litert_model.json").write_text("{}")
  for args, message in (
      ([f"--export_dir={embedder}", "--feed=txt=a"],
       "error: --feed=txt=a: give NAME=VALUE for one of the inputs text (string)"),
      ([f"--export_dir={encoder}", f"--feed=input_word_ids={ids}"],
       "error: --feed: give input_mask, input_type_ids too"),
      ([f"--export_dir={encoder}", "--feed=input_word_ids=[[1, 2]", "--feed=input_mask=[[1]]",
        "--feed=input_type_ids=[[0]]"],
       "error: --feed=input_word_ids=[[1, 2]: input_word_ids (int32) takes a JSON array"),
      ([f"--export_dir={encoder}", "--feed=input_word_ids=[[1, 2]]", "--feed=input_mask=[[1]]",
        "--feed=input_type_ids=[[0, 0]]"],
       "error: --feed: the model does not take these values"),
      ([f"--export_dir={litert_dir}", "--feed=text=a"],
       f"error: --export_dir={litert_dir} is a LiteRT model directory"),
      ([f"--export_dir={tmp_path}", "--feed=text=a"],
       f"error: --export_dir={tmp_path} holds no SavedModel"),
      ([f"--export_dir={embedder}", "--signature=nope", "--feed=text=a"],
       f"error: --signature=nope: {embedder} has serving_default")):
    result = run_process([PYTHON, "query_model.py", *args], cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 2 and result.stdout == "", result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(message), result.stderr[-3000:]
