"""Per-token hidden states of a pre-trained BERT, as JSON lines (the original's output format).

Each input line is a text, or two texts as `text_a ||| text_b`. Each output line is
{"linex_index": i, "features": [{"token": t, "layers": [{"index": -1, "values": [...]}, ...]}]}
for every WordPiece token of the line's [CLS] a [SEP] (b [SEP]) sequence; `linex_index` (sic) is
the 0-based input line, `index` a layer as numbered by --layers (-1 = the last encoder layer) and
the values are rounded to 6 decimals. The checkpoint may be a Google TF1 one, a HuggingFace
safetensors directory, or one of this project's.

With --pooling (mean, cls or max; --normalize for unit length) each output line is instead the
line's sentence vector, as sentence-transformers computes it, {"linex_index": i, "embedding":
[...]}, from one layer (--layers, default -1), pooled in the graph over the real tokens. With
the packaged all-MiniLM-L6-v2, `--pooling=mean --normalize --max_seq_length=256` gives its
sentence-transformers embeddings (tests/test_extract_features.py checks them within 1e-5).

A line longer than --max_seq_length is truncated, as in the original; with --doc_stride it is read
whole in overlapping windows (text_b of a pair, else the text; see sliding_windows.py) and its
output line still holds every token once: a token of the windowed text has the vectors of the
window where it has the most context (run_squad's rule), [CLS], text_a and the first [SEP] those
of the first window, the last [SEP] those of the last.

The input is read and written in chunks, so memory does not grow with the input file; the output
appears under --output_file only when the whole input has been processed.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import dataclasses
import itertools
import json
import os
import types

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import devices
from bert_tf2 import input_pipeline
from bert_tf2 import litert
from bert_tf2 import modeling
from bert_tf2 import script_flags
from bert_tf2 import sliding_windows
from bert_tf2 import tokenization
from bert_tf2 import training

FLAGS = flags.FLAGS


def define_flags():
  """The flags of extract_features.py: the shared groups (script_flags), then its own."""
  script_flags.define_runtime_flags()
  script_flags.define_checkpoint_flags()
  script_flags.define_litert_model_flag()
  script_flags.define_text_flags()
  script_flags.define_max_seq_length(128)
  script_flags.define_dynamic_padding_flag()
  script_flags.define_doc_stride_flag()
  script_flags.define_pooling_flags()

  script_flags.define_input_file_flag()
  script_flags.define_output_file_flag()

  flags.DEFINE_string("layers", "-1,-2,-3,-4",
                      "Comma-separated encoder layers to output: -1 is the last, 0 the first. "
                      "With --pooling: the one layer pooled (default -1).")

  flags.DEFINE_integer("batch_size", 32, "Sequences per forward pass (over all replicas).",
                       lower_bound=1)
  flags.DEFINE_bool("split_special_tokens", True,
                    "Special tokens written in the text ([CLS], [SEP], [MASK], ...) are split "
                    "like any text, as the original's tokenizer does; false: read as those "
                    "tokens, as HuggingFace's tokenizers and sentence-transformers do.")

  flags.DEFINE_bool("use_one_hot_embeddings", False,
                    "The original's TPU switch; accepted and ignored (the lookup is a gather).")


# Input lines per chunk, in batches: enough to keep the model busy, few enough that the
# tokenized chunk is small next to the outputs held.
_BATCHES_PER_CHUNK = 64
# Output values held at once (256 MiB of float32): lines run sorted by length within a group of
# that many values and are written back in input order, so memory does not grow with the input.
_MAX_HELD_VALUES = 64 * 2**20


@dataclasses.dataclass
class InputFeatures:
  """One sequence the model reads, a line or one window of a long line (--doc_stride): its
  tokens and the padded id / mask / segment lists."""

  unique_id: int
  tokens: list
  input_ids: list
  input_mask: list
  input_type_ids: list
  # The input line (0-based) this sequence reads; the same as unique_id for a line in one window.
  line_index: int = 0
  # Where a window's outputs go in its line's output: (line position, window position) pairs;
  # None when the window is the whole line.
  sources: list | None = None


def split_line(line):
  """`text_a ||| text_b` -> (text_a, text_b); a line without the separator is (line, None).

  The line is stripped first and split at the last " ||| ", as the original's greedy pattern
  did; an empty second text counts as none.
  """
  line = line.strip()
  text_a, separator, text_b = line.rpartition(" ||| ")
  if not separator:
    return line, None
  return text_a, text_b or None


def convert_lines_to_features(numbered_lines, seq_length, tokenizer, doc_stride=None,
                              split_special_tokens=True):
  """[(line index, line)] -> InputFeatures: [CLS] a [SEP] (b [SEP]), segment 0 then 1; a line
  too long for `seq_length` truncated, or with `doc_stride` one feature per window (a line's in
  a row, see the module docstring). unique_ids count from the first line's index. Without
  `split_special_tokens`, "[CLS]" and the like in a text are those tokens (HuggingFace's way)."""
  pairs = [split_line(line) for _, line in numbered_lines]
  tokenize = (tokenizer.tokenize_batch if split_special_tokens
              else tokenizer.tokenize_batch_keeping_special_tokens)
  tokens_a = tokenize([a for a, _ in pairs])
  tokens_b = tokenize([b or "" for _, b in pairs])
  features = []
  unique_id = numbered_lines[0][0] if numbered_lines else 0
  for (line_index, _), (_, text_b), a, b in zip(numbered_lines, pairs, tokens_a, tokens_b):
    a, b, spans = sliding_windows.sequence_windows(a, b if text_b else [], seq_length,
                                                   doc_stride)
    # Line positions: [CLS] a [SEP] (0 .. len(a) + 1), then the windowed text from `offset`.
    offset = len(a) + 2 if b else 1
    if len(spans) > 1:
      best = [sliding_windows.max_context(spans, i) for i in range(len(b or a))]
    for index, span in enumerate(spans):
      tokens, type_ids = sliding_windows.window_tokens(a, b, span)
      sources = None
      if len(spans) > 1:
        start = len(tokens) - 1 - span.length  # the window's first token of the windowed text
        sources = [(offset + span.start + i, start + i) for i in range(span.length)
                   if best[span.start + i] == index]
        if index == 0:
          sources = [(i, i) for i in range(start)] + sources
        if index == len(spans) - 1:
          sources.append((offset + len(b or a), len(tokens) - 1))
      input_ids = tokenizer.convert_tokens_to_ids(tokens)
      padding = [0] * (seq_length - len(input_ids))
      features.append(InputFeatures(unique_id, tokens, input_ids + padding,
                                    [1] * len(input_ids) + padding, type_ids + padding,
                                    line_index, sources))
      unique_id += 1
  return features


def parse_layers(text, num_hidden_layers):
  """--layers -> list of ints, each a valid index into the encoder's layers."""
  try:
    layers = [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise fileio.InputError(f"--layers={text!r}: expected comma-separated integers") from None
  if not layers:
    raise fileio.InputError("--layers is empty")
  for index in layers:
    if not -num_hidden_layers <= index < num_hidden_layers:
      raise fileio.InputError(f"--layers: {index} is not a layer of a {num_hidden_layers}-layer "
                              f"model (use {-num_hidden_layers}..{num_hidden_layers - 1})")
  return layers


class LayerExtractor(tf.Module):
  """A BertModel (as `bert`, so this project's checkpoints load by object path too) that returns
  the chosen encoder layers stacked: `layers` [batch, len(layer_indexes), seq, hidden] float32;
  with `pooling`, the sentence vectors of the one chosen layer instead: `embedding` [batch,
  hidden] float32 (modeling.pool_tokens)."""

  def __init__(self, config, layer_indexes, compute_dtype=tf.float32, pooling=None,
               normalize=False):
    super().__init__(name="extractor")
    self.bert = modeling.BertModel(config, compute_dtype)
    self.layer_indexes = list(layer_indexes)
    self.pooling = pooling
    self.normalize = normalize

  def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
    outputs = self.bert(features["input_ids"], features["input_mask"], features["input_type_ids"],
                        training=training, dropout_seed=dropout_seed,
                        inference_weights=inference_weights)
    layers = outputs["encoder_outputs"]
    if self.pooling:
      return {"embedding": modeling.pool_tokens(layers[self.layer_indexes[0]],
                                                features["input_mask"], self.pooling,
                                                self.normalize)}
    return {"layers": tf.cast(tf.stack([layers[i] for i in self.layer_indexes], axis=1),
                              tf.float32)}


class LiteRTExtractor:
  """A LiteRT encoder or embedder (--litert_model, litert.Model) in the place of the Trainer of
  a LayerExtractor: `predict` gives the same outputs (`layers`, `embedding`), and `model` what
  extract() reads of it (`bert.config`, `pooling`)."""

  def __init__(self, runner, config, layer_indexes, pooling=None, normalize=False):
    self.runner = runner
    self.strategy = runner.strategy
    self.is_chief = True
    self.model = self
    self.bert = types.SimpleNamespace(config=config)
    self.layer_indexes = list(layer_indexes)
    self.pooling = pooling
    self.normalize = normalize

  def predict(self, dataset_fn, output_keys):
    del output_keys  # `embedding` with pooling, else `layers`
    embedder = self.runner.kind == "embedder"
    for batch in self.runner.predict(dataset_fn,
                                     ["embedding" if embedder else "encoder_outputs"]):
      if not embedder:
        layers = batch.pop("encoder_outputs")[:, self.layer_indexes]
        if self.pooling:
          batch["embedding"] = modeling.pool_tokens(layers[:, 0], batch["input_mask"],
                                                    self.pooling, self.normalize).numpy()
        else:
          batch["layers"] = layers
      yield batch


def _litert_extractor(runner, config, layer_indexes, pooling):
  """LiteRTExtractor of --litert_model, its flags checked against what the model is."""
  if runner.kind == "embedder":  # its vectors are pooled in the model
    own = runner.info.get("pooling"), bool(runner.info.get("normalize"))
    if (pooling and pooling != own[0]) or (FLAGS["normalize"].present and FLAGS.normalize !=
                                           own[1]) or (FLAGS["layers"].present and
                                                       layer_indexes != [-1]):
      raise fileio.InputError(
          f"--litert_model={FLAGS.litert_model} is an embedder of --pooling={own[0]} "
          f"--normalize={own[1]} over the last layer: give those (or none), or export an encoder "
          "for other poolings and layers")
    return LiteRTExtractor(runner, config, [-1], *own)
  return LiteRTExtractor(runner, config, layer_indexes, pooling, FLAGS.normalize)


def rounded(values):
  """float32 array -> nested lists of Python floats equal to round(float(x), 6) for each x.

  Exact, not approximately so: a float32 has a 24-bit significand and 10**6 = 2**6 * 15625 a
  14-bit odd part, so x * 1e6 is exact in float64; rint then rounds half to even as Python's
  round does, and the division gives the float64 nearest to the rounded decimal, as Python's
  round returns. Vectorised, it is many times faster than a Python loop over the values.
  """
  return (np.rint(values.astype(np.float64) * 1e6) / 1e6).tolist()


def feature_json(line_index, tokens, layer_values, layer_indexes):
  """One output line for the `tokens` of input line `line_index`; layer_values
  [len(layer_indexes), len(tokens), hidden]."""
  values = rounded(layer_values[:, :len(tokens)])
  return json.dumps({
      "linex_index": line_index,
      "features": [{"token": token,
                    "layers": [{"index": index, "values": values[j][i]}
                               for j, index in enumerate(layer_indexes)]}
                   for i, token in enumerate(tokens)],
  })


def line_outputs(windows, values):
  """(tokens, [layers, tokens, hidden] values) of one input line from the InputFeatures of its
  `windows` and `values` ({unique_id: [layers, window tokens, hidden]}): each token once, from
  the window its `sources` name."""
  if len(windows) == 1 and windows[0].sources is None:
    return windows[0].tokens, values[windows[0].unique_id]
  size = sum(len(window.sources) for window in windows)
  tokens = [None] * size
  first = values[windows[0].unique_id]
  line_values = np.empty((first.shape[0], size, first.shape[2]), first.dtype)
  for window in windows:
    for line_position, window_position in window.sources:
      tokens[line_position] = window.tokens[window_position]
    line_positions = [line_position for line_position, _ in window.sources]
    window_positions = [window_position for _, window_position in window.sources]
    line_values[:, line_positions] = values[window.unique_id][:, window_positions]
  return tokens, line_values


def _chunks(iterable, size):
  iterator = iter(iterable)
  while chunk := list(itertools.islice(iterator, size)):
    yield chunk


def _lines(features):
  """The features of each input line (its windows), in input order."""
  return [list(windows) for _, windows in itertools.groupby(features, lambda f: f.line_index)]


def _groups(features, max_tokens):
  """Consecutive runs of `features` of at most `max_tokens` real tokens (at least one line each,
  a line's windows together): the lines whose outputs are held at once to be written back in
  input order."""
  group, tokens = [], 0
  for windows in _lines(features):
    size = sum(len(f.tokens) for f in windows)
    if group and tokens + size > max_tokens:
      yield group
      group, tokens = [], 0
    group.extend(windows)
    tokens += size
  if group:
    yield group


def _layer_values(trainer, group, seq_length, batch_size, pad_to_longest, output="layers"):
  """{unique_id: float32 [layers, tokens, hidden]} of the sequences in `group` (`output`
  "embedding": their [hidden] sentence vectors): run sorted by length when `pad_to_longest`
  (each batch then holds sequences of about one length and runs only up to its longest,
  input_pipeline.trim_to_longest), in input order otherwise."""
  # No larger than the lines need (a short input under a huge --batch_size).
  per_replica_batch_size, global_batch = training.prediction_batch_size(
      batch_size, len(group), trainer.strategy, "batch_size")
  order = (input_pipeline.length_order([len(f.tokens) for f in group]) if pad_to_longest
           else np.arange(len(group)))
  # Zero rows (id -1) fill the last batch: one batch shape, one compiled function.
  pad = -len(group) % global_batch
  rows = [group[i] for i in order]
  arrays = {
      "unique_ids": np.array([f.unique_id for f in rows] + [-1] * pad, np.int64),
      "input_ids": np.array([f.input_ids for f in rows] + [[0] * seq_length] * pad, np.int32),
      "input_mask": np.array([f.input_mask for f in rows] + [[0] * seq_length] * pad, np.int32),
      "input_type_ids": np.array([f.input_type_ids for f in rows] + [[0] * seq_length] * pad,
                                 np.int32),
  }

  def dataset_fn(ctx):
    # Several workers each take every num_workers-th sequence (Trainer.predict puts them back).
    dataset = tf.data.Dataset.from_tensor_slices(arrays).shard(ctx.num_input_pipelines,
                                                               ctx.input_pipeline_id)
    dataset = dataset.batch(per_replica_batch_size, drop_remainder=True)
    if pad_to_longest:
      multiple = input_pipeline.length_multiple(seq_length)
      dataset = dataset.map(lambda batch: input_pipeline.trim_to_longest(batch, multiple))
    return dataset

  lengths = {f.unique_id: len(f.tokens) for f in group}
  values = {}
  for outputs in trainer.predict(dataset_fn, [output]):
    for unique_id, value in zip(outputs["unique_ids"].tolist(), outputs[output]):
      if unique_id >= 0:
        # A copy, not a view of the batch.
        values[unique_id] = np.array(value if output == "embedding"
                                     else value[:, :lengths[unique_id]])
  return values


def extract(trainer, tokenizer, layer_indexes, input_file, writer, seq_length, batch_size,
            pad_to_longest=False, doc_stride=None, split_special_tokens=True):
  """Streams `input_file` through the model into `writer` (a text file), lines in input order.
  Returns the line count. `pad_to_longest` runs the sequences of each group of held lines sorted
  by length, each batch only up to its longest: on real text (WikiText) about half the model
  time of batches in input order. `doc_stride`: long lines in windows (module docstring)."""
  count = 0
  hidden_size = trainer.model.bert.config.hidden_size
  max_tokens = max(1, _MAX_HELD_VALUES // (len(layer_indexes) * hidden_size))
  lines = ((number - 1, line) for number, line in fileio.read_lines(input_file))
  pooled = bool(trainer.model.pooling)
  for chunk in _chunks(lines, batch_size * _BATCHES_PER_CHUNK):
    features = convert_lines_to_features(chunk, seq_length, tokenizer, doc_stride,
                                         split_special_tokens)
    if pooled:  # one vector a line (no windows: --doc_stride is refused with --pooling)
      values = _layer_values(trainer, features, seq_length, batch_size, pad_to_longest,
                             "embedding")
      for feature in features:
        writer.write(json.dumps({"linex_index": feature.line_index,
                                 "embedding": rounded(values[feature.unique_id])}))
        writer.write("\n")
        count += 1
      continue
    for group in _groups(features, max_tokens):
      values = _layer_values(trainer, group, seq_length, batch_size, pad_to_longest)
      for windows in _lines(group):
        tokens, line_values = line_outputs(windows, values)
        writer.write(feature_json(windows[0].line_index, tokens, line_values, layer_indexes))
        writer.write("\n")
        count += 1
    logging.info("%d lines done", count)
  return count


def main(_):
  vocab_file, config_file, do_lower_case = (FLAGS.vocab_file, FLAGS.bert_config_file,
                                            FLAGS.do_lower_case)
  runner = None
  if FLAGS.litert_model:  # its directory holds the vocab, the config and the casing
    runner = litert.open_for_script(
        FLAGS.litert_model, ("encoder", "embedder"), "extract_features.py",
        {name: FLAGS[name].value for name in ("init_checkpoint", "bert_config_file",
                                              "vocab_file")},
        FLAGS.do_lower_case if FLAGS["do_lower_case"].present else None)
    vocab_file, config_file, do_lower_case = (runner.vocab_file, runner.config_file,
                                              runner.do_lower_case)
    fileio.require(input_file=FLAGS.input_file, output_file=FLAGS.output_file)
    inputs = [("litert_model", [os.path.join(FLAGS.litert_model, name)
                                for name in fileio.listdir(FLAGS.litert_model)])]
  else:
    vocab_file = checkpoints.vocab_file_or_beside(vocab_file, FLAGS.init_checkpoint)
    fileio.require(input_file=FLAGS.input_file, output_file=FLAGS.output_file,
                   vocab_file=vocab_file, init_checkpoint=FLAGS.init_checkpoint)
    checkpoint_dir = checkpoints.checkpoint_directory(FLAGS.init_checkpoint)
    configs = [config_file] + [os.path.join(checkpoint_dir, name)
                               for name in checkpoints.CONFIG_NAMES]
    inputs = [("init_checkpoint", checkpoints.checkpoint_files(FLAGS.init_checkpoint)),
              ("bert_config_file", configs)]
  fileio.check_file(FLAGS.input_file, "--input_file")
  fileio.check_file(vocab_file, "--vocab_file")
  fileio.check_outputs(
      files=[("output_file", FLAGS.output_file)],
      inputs=[("input_file", FLAGS.input_file), ("vocab_file", vocab_file), *inputs])
  if fileio.size(FLAGS.input_file) == 0:
    raise fileio.InputError(f"--input_file={FLAGS.input_file} is empty: no line to extract "
                            "features of")
  if runner:
    config = modeling.BertConfig.from_json_file(config_file)
    checkpoints.check_seq_length(FLAGS.max_seq_length, config, config_file)
  else:
    tokenization.validate_case_matches_checkpoint(do_lower_case, FLAGS.init_checkpoint)
    config = checkpoints.load_bert_config(config_file, FLAGS.init_checkpoint,
                                          FLAGS.max_seq_length)
  pooling = None if FLAGS.pooling == "none" else FLAGS.pooling
  if runner and runner.kind == "embedder" and not pooling:
    # An embedder pools in the model (its own --pooling, over the last layer): the default
    # --layers of token features (-1,-2,-3,-4) is not asked for, and fails on a 2-layer model.
    pooling = runner.info.get("pooling")
  if FLAGS.normalize and not pooling:
    raise fileio.InputError("--normalize scales sentence vectors: give --pooling too")
  layer_indexes = parse_layers(FLAGS.layers if FLAGS["layers"].present or not pooling else "-1",
                               config.num_hidden_layers)
  if pooling and len(layer_indexes) > 1:
    raise fileio.InputError(f"--pooling={pooling} pools one layer, but --layers={FLAGS.layers} "
                            f"names {len(layer_indexes)}")
  if pooling and FLAGS.doc_stride is not None:
    raise fileio.InputError(f"--doc_stride with --pooling={pooling}: a sentence vector is of one "
                            "sequence (a longer line is truncated, as sentence-transformers does)")
  if FLAGS.doc_stride is not None:
    sliding_windows.check_stride(
        FLAGS.doc_stride, FLAGS.max_seq_length - 2,
        f"text tokens of a window (--max_seq_length={FLAGS.max_seq_length} - 2 for "
        "[CLS] text [SEP])")
  tokenizer = tokenization.load_tokenizer(vocab_file, do_lower_case)
  # An id past the model's embedding table would fail deep in the graph ("Graph execution
  # error"); checked here, naming both files.
  tokenization.check_vocab_fits(max(tokenizer.vocab.values(), default=-1) + 1, config,
                                vocab_file, config_file or
                                f"the config of --init_checkpoint={FLAGS.init_checkpoint}")
  if runner:
    trainer = _litert_extractor(runner, config, layer_indexes, pooling)
    _write_features(trainer, tokenizer, layer_indexes, pad_to_longest=True)
    return

  strategy = script_flags.strategy()
  training.per_replica_batch_size(FLAGS.batch_size, strategy, "batch_size")  # checked early
  with strategy.scope():
    model = LayerExtractor(config, layer_indexes, script_flags.compute_dtype(), pooling,
                           FLAGS.normalize)
  report = checkpoints.init_from_checkpoint(model, FLAGS.init_checkpoint)
  # Every encoder variable must come from the checkpoint; only the pooler, which no output here
  # uses, may be missing (some exported encoders drop it).
  missing = [n for n in report.missing if not n.startswith("bert/pooler/")]
  if missing:
    raise fileio.InputError(f"{FLAGS.init_checkpoint} lacks encoder variables: "
                            f"{', '.join(missing)}")
  trainer = training.Trainer(strategy, model, loss_fn=None, use_xla=FLAGS.use_xla)
  _write_features(trainer, tokenizer, layer_indexes,
                  devices.dynamic_padding(FLAGS.dynamic_padding, strategy))


def _write_features(trainer, tokenizer, layer_indexes, pad_to_longest):
  # Under multi_worker_mirrored every worker computes its share and gets all outputs; the
  # chief writes them.
  output = (fileio.open_atomic(FLAGS.output_file) if trainer.is_chief
            else open(os.devnull, "w", encoding="utf-8"))
  with fileio.naming_output(FLAGS.output_file), output as writer:
    count = extract(trainer, tokenizer, layer_indexes, FLAGS.input_file, writer,
                    FLAGS.max_seq_length, FLAGS.batch_size, pad_to_longest=pad_to_longest,
                    doc_stride=FLAGS.doc_stride,
                    split_special_tokens=FLAGS.split_special_tokens)
  logging.info("Wrote the features of %d lines to %s", count, FLAGS.output_file)


def cli():
  """The command line: `python extract_features.py` and the `bert-extract-features` command."""
  define_flags()
  commands.run_main(main)
