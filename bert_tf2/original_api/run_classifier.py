"""The original's `run_classifier` library (google-research/bert's run_classifier.py) on the
project's code.

Code written against the original makes `InputExample`s (or reads a GLUE task with a processor)
and turns them into `InputFeatures` with `convert_examples_to_features`, or into a TFRecord file
with `file_based_convert_examples_to_features`. Those are the project's own objects
(bert_tf2/classifier_tasks.py, bert_tf2/run_classifier.py), whose signatures are the original's
and whose features are the original's, id for id: [CLS] a [SEP] b [SEP], the longer text cut
first, zeros up to max_seq_length. The processors are the original's four (CoLA, MNLI, MRPC,
XNLI) with its methods, reading through the project's task readers (columns found by the header's
names, an error naming file and line for a bad row); a processor of your own subclasses
`DataProcessor` and reads rows with `_read_tsv`, as with the original.

Gone, with tf.estimator (removed from TensorFlow in 2.16): `create_model`, `model_fn_builder`,
`input_fn_builder` and `file_based_input_fn_builder`, the graph and the `input_fn(params)` of a
TPUEstimator. Asking for one names what does that work now.
"""

from bert_tf2 import classifier_tasks
from bert_tf2 import run_classifier
from bert_tf2 import tokenization

__all__ = ["InputExample", "PaddingInputExample", "InputFeatures", "DataProcessor",
           "XnliProcessor", "MnliProcessor", "MrpcProcessor", "ColaProcessor",
           "convert_single_example", "convert_examples_to_features",
           "file_based_convert_examples_to_features", "_truncate_seq_pair",
           # (so that `from ... import *` gives the root module the pointers below too)
           "__getattr__"]

# The project's objects, the original's signatures: InputExample(guid, text_a, text_b=None,
# label=None), InputFeatures(input_ids, input_mask, segment_ids, label_id, is_real_example=True),
# convert_single_example(ex_index, example, label_list, max_seq_length, tokenizer), ...
InputExample = classifier_tasks.InputExample
PaddingInputExample = run_classifier.PaddingInputExample
InputFeatures = run_classifier.InputFeatures
convert_single_example = run_classifier.convert_single_example
convert_examples_to_features = run_classifier.convert_examples_to_features
file_based_convert_examples_to_features = run_classifier.file_based_convert_examples_to_features
# The longer list loses its last token until both fit (the second on a tie), in place.
_truncate_seq_pair = tokenization.truncate_seq_pair


class DataProcessor(classifier_tasks.DataProcessor):
  """The original's base class of a task's reader: get_train_examples(data_dir),
  get_dev_examples(data_dir), get_test_examples(data_dir) and get_labels()."""

  @classmethod
  def _read_tsv(cls, input_file, quotechar=None):
    """The rows of a tab-separated file as lists of fields, as the original's reader gives them
    (the project's gives (line number, fields) pairs). Blank lines are skipped."""
    return [fields for _, fields in
            classifier_tasks.DataProcessor._read_tsv(input_file, quotechar)]


class _ProjectTask(DataProcessor):
  """One of the original's processors, reading through the project's processor of the task:
  the same examples (guids, texts, labels; test examples get the first label, as there)."""

  _task = None  # the project's processor class

  def task(self):
    return self._task()

  def get_train_examples(self, data_dir):
    return self.task().get_train_examples(data_dir)

  def get_dev_examples(self, data_dir):
    return self.task().get_dev_examples(data_dir)

  def get_test_examples(self, data_dir):
    return self.task().get_test_examples(data_dir)

  def get_labels(self):
    return self.task().get_labels()


class XnliProcessor(_ProjectTask):
  """XNLI in one language, `self.language` ("zh", as in the original): MultiNLI translated into
  it for training, its rows of xnli.dev.tsv for evaluation."""

  def __init__(self):
    self.language = "zh"

  def task(self):
    # Read when called, so that setting `processor.language` (the original's attribute) counts.
    return classifier_tasks.XnliProcessor(self.language)


class MnliProcessor(_ProjectTask):
  """MultiNLI (GLUE), the matched dev and test sets; guids from its index column."""
  _task = classifier_tasks.MnliProcessor


class MrpcProcessor(_ProjectTask):
  """MRPC (GLUE): two sentences, paraphrases ("1") or not ("0")."""
  _task = classifier_tasks.MrpcProcessor


class ColaProcessor(_ProjectTask):
  """CoLA (GLUE): one sentence, acceptable ("1") or not ("0")."""
  _task = classifier_tasks.ColaProcessor


# What the original's Estimator pieces became.
_GONE = {
    "create_model": "bert_tf2.modeling.BertClassifier (the encoder with its classifier head) and "
                    "modeling.classifier_losses",
    "model_fn_builder": "bert_tf2.training.Trainer for training, evaluation and prediction "
                        "(fine_tuning.build_trainer sets one up from a checkpoint)",
    "input_fn_builder": "a tf.data.Dataset of the InputFeatures (or "
                        "file_based_convert_examples_to_features, then "
                        "bert_tf2.fine_tuning.input_fn_builder)",
    "file_based_input_fn_builder": "bert_tf2.fine_tuning.input_fn_builder(input_file, "
                                   "bert_tf2.run_classifier.feature_spec(seq_length), ...)",
}


def __getattr__(name):
  if name in _GONE:
    raise AttributeError(f"run_classifier.{name} served tf.estimator, which TensorFlow 2 no "
                         f"longer has: use {_GONE[name]}")
  raise AttributeError(f"module 'run_classifier' has no attribute {name!r}")
