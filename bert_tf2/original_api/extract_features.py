"""The original's `extract_features` library (google-research/bert's extract_features.py) on the
project's code.

`read_examples(input_file)` reads one example a line, `text_a ||| text_b` for a pair, and
`convert_examples_to_features(examples, seq_length, tokenizer)` makes the sequences the model
reads: [CLS] a [SEP] (b [SEP]), the longer text cut first, zeros up to seq_length. The line split
and the sequences are the project's script's own (bert_tf2/extract_features.py,
bert_tf2/sliding_windows.py), which its tests compare with the original's output format.

Gone, with tf.estimator (removed from TensorFlow in 2.16): `input_fn_builder` and
`model_fn_builder`, the `input_fn(params)` and graph of a TPUEstimator. Asking for one names what
does that work now.
"""

import dataclasses

from bert_tf2 import extract_features
from bert_tf2 import fileio
from bert_tf2 import fine_tuning
from bert_tf2 import sliding_windows
from bert_tf2 import tokenization

__all__ = ["InputExample", "InputFeatures", "read_examples", "convert_examples_to_features",
           "_truncate_seq_pair",
           # (so that `from ... import *` gives the root module the pointers below too)
           "__getattr__"]

# The project's, with the original's fields first: InputFeatures(unique_id, tokens, input_ids,
# input_mask, input_type_ids).
InputFeatures = extract_features.InputFeatures
# The longer list loses its last token until both fit (the second on a tie), in place.
_truncate_seq_pair = tokenization.truncate_seq_pair


@dataclasses.dataclass
class InputExample:
  """One input line: its 0-based number and its text, or two texts (text_b None for one)."""

  unique_id: int
  text_a: str
  text_b: str | None


def read_examples(input_file):
  """The examples of a UTF-8 text file, one a line, blank lines included (as empty texts), split
  at the last " ||| " of the stripped line (the original's greedy pattern); unique_ids count
  lines from 0."""
  return [InputExample(number - 1, *extract_features.split_line(line))
          for number, line in fileio.read_lines(input_file)]


def convert_examples_to_features(examples, seq_length, tokenizer):
  """One InputFeatures per example, its sequence truncated to `seq_length` as the original's."""
  features = []
  for example in examples:
    tokens_a = tokenizer.tokenize(example.text_a)
    tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else []
    # One window: the text cut as the original cuts it (a pair by _truncate_seq_pair).
    tokens_a, tokens_b, (span,) = sliding_windows.sequence_windows(tokens_a, tokens_b, seq_length)
    tokens, input_type_ids = sliding_windows.window_tokens(tokens_a, tokens_b, span)
    input_ids, input_mask, input_type_ids = fine_tuning.padded_ids(tokenizer, tokens,
                                                                   input_type_ids, seq_length)
    features.append(InputFeatures(example.unique_id, tokens, input_ids, input_mask,
                                  input_type_ids, line_index=example.unique_id))
  return features


_GONE = {
    "input_fn_builder": "a tf.data.Dataset of the InputFeatures' ids",
    "model_fn_builder": "bert_tf2.extract_features.LayerExtractor (the encoder's layers as "
                        "outputs) on a checkpoint loaded with bert_tf2.checkpoints",
}


def __getattr__(name):
  if name in _GONE:
    raise AttributeError(f"extract_features.{name} served tf.estimator, which TensorFlow 2 no "
                         f"longer has: use {_GONE[name]}")
  raise AttributeError(f"module 'extract_features' has no attribute {name!r}")
