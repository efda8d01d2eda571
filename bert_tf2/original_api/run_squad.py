"""The original's `run_squad` library (google-research/bert's run_squad.py) on the project's code.

Code written against the original reads a SQuAD file into `SquadExample`s with
`read_squad_examples(input_file, is_training)`, cuts them into windows with
`convert_examples_to_features(examples, tokenizer, max_seq_length, doc_stride, max_query_length,
is_training, output_fn)` (each `InputFeatures` passed to `output_fn`, often a `FeatureWriter`'s
`process_feature`), and turns the model's `RawResult`s into answers with `write_predictions`.
Those are the project's own functions (bert_tf2/run_squad.py) with the original's signatures; the
original read `version_2_with_negative` and a few others from its flags, here they are keyword
arguments with the original's defaults (`version_2_with_negative=False`,
`null_score_diff_threshold=0.0`, `verbose_logging=False`).

Gone, with tf.estimator (removed from TensorFlow in 2.16): `create_model`, `model_fn_builder`,
`input_fn_builder`, `validate_flags_or_throw`. Asking for one names what does that work now.
"""

from bert_tf2 import run_squad
from bert_tf2 import tfrecord_io

__all__ = ["SquadExample", "InputFeatures", "RawResult", "FeatureWriter", "read_squad_examples",
           "convert_examples_to_features", "write_predictions", "get_final_text",
           "_improve_answer_span", "_get_best_indexes", "_compute_softmax",
           # (so that `from ... import *` gives the root module the pointers below too)
           "__getattr__"]

SquadExample = run_squad.SquadExample
InputFeatures = run_squad.InputFeatures
RawResult = run_squad.RawResult
read_squad_examples = run_squad.read_squad_examples
convert_examples_to_features = run_squad.convert_examples_to_features
write_predictions = run_squad.write_predictions
get_final_text = run_squad.get_final_text
_improve_answer_span = run_squad._improve_answer_span  # pylint: disable=protected-access
_get_best_indexes = run_squad._get_best_indexes  # pylint: disable=protected-access
_compute_softmax = run_squad._compute_softmax  # pylint: disable=protected-access


class FeatureWriter:
  """The original's FeatureWriter(filename, is_training): `process_feature(feature)` adds one
  window's record (the original's feature names) to the TFRecord file, `close()` ends it. The
  file is written under a temporary name and appears whole at `close()`."""

  def __init__(self, filename, is_training):
    self.filename = filename
    self.is_training = is_training
    self.num_features = 0
    self._writer = tfrecord_io.ExampleWriter(filename)

  def process_feature(self, feature):
    self.num_features += 1
    self._writer.write(run_squad.squad_record(feature, self.is_training))

  def close(self):
    self._writer.close()


_GONE = {
    "create_model": "bert_tf2.modeling.BertSpanLabeler (start and end logits over a BertModel)",
    "model_fn_builder": "bert_tf2.modeling.BertSpanLabeler with modeling.squad_losses in "
                        "bert_tf2.training.Trainer",
    "input_fn_builder": "a tf.data.TFRecordDataset of FeatureWriter's file parsed with "
                        "bert_tf2.run_squad.feature_spec(seq_length, is_training)",
    "validate_flags_or_throw": "the script's own checks (python run_squad.py checks its flags)",
}


def __getattr__(name):
  if name in _GONE:
    raise AttributeError(f"run_squad.{name} served tf.estimator, which TensorFlow 2 no longer "
                         f"has: use {_GONE[name]}")
  raise AttributeError(f"module 'run_squad' has no attribute {name!r}")
