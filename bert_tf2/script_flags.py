"""The command-line flags the scripts share, each defined once with one help text, and the three
values a script builds from flags: a settings record of them (`settings`: the knobs of training,
fine-tuning or a script, as plain values), the strategy and the compute dtype.

Every script defines its flags in its `define_flags()`, which its `cli()` calls (so importing a
script defines no flag, and one process defines one script's flags), from the `define_*` groups
here and flags of its own, each with the script's default passed in (never changed afterwards);
it reads the flags in its `main`, and the library modules it hands the values to (training,
optimization, modeling, ...) take plain arguments and never read FLAGS. Groups overlap (the
fine-tuning group holds the training group): a flag asked for again is left as it is, and asking
for it with another default is a programming error. A missing required value is an
`errors.InputError` naming every missing flag from the script's main (`errors.require`), the
same for flags that are always required and those required only in some runs.
"""

import dataclasses
import sys

from absl import flags

from bert_tf2 import pretraining_data

FLAGS = flags.FLAGS

# The heading each shared flag is listed under in --help, from the define_* group that defined it.
GROUPS = {}
_TITLES = {"runtime": "devices and precision", "mode": "what to run", "output_dir": "files",
           "input_file": "files", "output_file": "files", "overwrite": "files", "config": "model",
           "checkpoint": "model", "vocab": "text", "lower_case": "text", "text": "text",
           "max_seq_length": "sequences", "max_predictions": "sequences", "masking": "sequences",
           "doc_stride": "sequences", "dynamic_padding": "sequences", "data_dir": "task",
           "labels": "task", "regression": "task", "multi_label": "task", "squad": "SQuAD",
           "fine_tuning": "fine-tuning",
           "pooling": "sentence vectors", "litert_model": "model"}

# TensorFlow and the modules on it are imported by the functions that build values only:
# create_pretraining_data uses the groups here and never imports TensorFlow (it starts fast).
# pylint: disable=g-import-not-at-top


def _define(define, name, default, help_text, positive=False, **bounds):
  if name in FLAGS:
    if FLAGS[name].default != default:
      raise ValueError(f"--{name} asked for with the default {default!r}, but defined with "
                       f"{FLAGS[name].default!r}")
    return
  define(name, default, help=help_text, **bounds)
  # The calling define_* function names the group (define_training_flags -> "training").
  group = sys._getframe(1).f_code.co_name  # pylint: disable=protected-access
  group = group.removeprefix("define_").removesuffix("_flags").removesuffix("_flag")
  GROUPS[name] = _TITLES.get(group, group)
  if positive:
    require_positive(name)


def require_positive(name):
  """A validator for a float flag that must be strictly above 0 (absl's lower_bound includes
  the bound: a learning rate of 0 trains nothing, a negative one climbs the loss)."""
  flags.register_validator(name, lambda value: value is None or value > 0, message="must be > 0")


# --- groups ----------------------------------------------------------------------------------------


def define_runtime_flags():
  """Where and how the model runs: the tf.distribute strategy, precision, XLA, the seed."""
  _define(flags.DEFINE_enum, "distribution_strategy", "default",
          "tf.distribute strategy. `mirrored` uses every local GPU (or, with no GPU, "
          "--num_cpu_devices logical CPUs); `multi_worker_mirrored` reads TF_CONFIG.",
          enum_values=["default", "one_device", "mirrored", "multi_worker_mirrored", "tpu"])
  _define(flags.DEFINE_integer, "num_cpu_devices", 0,
          "With no GPU: split the CPU into this many logical devices for `mirrored` (tests and "
          "debugging of multi-replica code on a laptop). 0 = leave as is.", lower_bound=0)
  _define(flags.DEFINE_bool, "use_xla", False,
          "Compile the forward and backward pass with XLA (jit_compile).")
  _define(flags.DEFINE_enum, "mixed_precision", "none",
          "Compute dtype of matrix work; variables, LayerNorm, softmax and losses stay float32. "
          "fp16 adds dynamic loss scaling to the optimizer. auto: bf16 where the hardware has it "
          "(a CPU with AVX512_BF16 or AMX, a GPU of compute capability 8.0 or more, a TPU), "
          "float32 elsewhere.", enum_values=["none", "bf16", "fp16", "auto"])
  _define(flags.DEFINE_bool, "use_tpu", False,
          "The original's flag: same as --distribution_strategy=tpu.")
  _define(flags.DEFINE_string, "tpu_name", None, "TPU name or grpc address (with --use_tpu).")
  _define(flags.DEFINE_string, "tpu_zone", None, "GCE zone of the TPU (optional).")
  _define(flags.DEFINE_string, "gcp_project", None, "GCP project of the TPU (optional).")
  _define(flags.DEFINE_string, "master", None, "The original's flag; accepted as the TPU address.")
  _define(flags.DEFINE_integer, "num_tpu_cores", 8,
          "The original's flag; the TPU strategy reads the topology.", lower_bound=1)
  _define(flags.DEFINE_integer, "seed", 12345,
          "Seed for initialisation, dropout and shuffling.")


def define_training_flags(lr_schedule="original"):
  """The training loop and its optimizer (run_pretraining and the fine-tuning scripts), with the
  script's default --lr_schedule."""
  define_runtime_flags()
  define_output_dir_flag()
  _define(flags.DEFINE_integer, "train_batch_size", 32, "Global batch size for training.",
          lower_bound=1)
  _define(flags.DEFINE_integer, "eval_batch_size", 8, "Global batch size for evaluation.",
          lower_bound=1)
  _define(flags.DEFINE_float, "learning_rate", 5e-5, "Peak learning rate.", positive=True)
  _define(flags.DEFINE_integer, "gradient_accumulation_steps", 1,
          "Micro-batches per optimizer step; each is train_batch_size / this.", lower_bound=1)
  _define(flags.DEFINE_bool, "gradient_checkpointing", False,
          "Keep only each Transformer layer's input for the backward pass and recompute the "
          "layer there: far less activation memory (longer sequences or bigger batches fit) "
          "for about one more forward pass per step; the same gradients.")
  _define(flags.DEFINE_enum, "optimizer", "adamw",
          "adamw: Adam with bias correction and decoupled weight decay (torch / HuggingFace "
          "AdamW, epsilon 1e-8); adam_weight_decay: the original's Adam without bias correction "
          "(epsilon 1e-6), for faithful reproductions; it makes short fine-tuning runs on small "
          "sets collapse more often; lamb: LAMB for large-batch pre-training.",
          enum_values=["adamw", "adam_weight_decay", "lamb"])
  _define(flags.DEFINE_enum, "lr_schedule", lr_schedule,
          "original: linear decay from step 0 to num_train_steps, the warm-up ramp overriding "
          "its start (the original's; run_pretraining's default); decay_after_warmup: the decay "
          "starts at the peak when the warm-up ends (HF's get_linear_schedule_with_warmup; the "
          "fine-tuning scripts' default: after a 10% warm-up the original's rate is 0.9x this "
          "one, and CoLA scored 1.1 points below HF with it, 0.5 with this).",
          enum_values=["original", "decay_after_warmup"])
  _define(flags.DEFINE_integer, "iterations_per_loop", 100,
          "Steps run inside one tf.function call, at most (the original's TPU loop). Progress "
          "(step, loss, rate, ETA) is logged after the first step, then after each loop, and "
          "loops end early so that a line comes about every 30 s.", lower_bound=1)
  _define(flags.DEFINE_integer, "save_checkpoints_steps", 1000, "Steps between checkpoints.",
          lower_bound=1)
  _define(flags.DEFINE_integer, "keep_checkpoint_max", 5, "Checkpoints kept in output_dir.",
          lower_bound=1)
  _define(flags.DEFINE_integer, "max_nonfinite_loops", 3,
          "Stop when this many consecutive loops of steps all had a non-finite loss.",
          lower_bound=1)


def define_mode_flags(*modes):
  """--do_train, --do_eval, --do_predict: what a run does (`modes`: those the script has)."""
  texts = {"train": "Train (fine-tune) on the training data.",
           "eval": "Score the model on the evaluation data; writes eval_results.txt.",
           "predict": "Write the model's predictions for the prediction data."}
  for mode in modes:
    _define(flags.DEFINE_bool, f"do_{mode}", False, texts[mode])


def define_output_dir_flag():
  """--output_dir: the directory a script writes into."""
  _define(flags.DEFINE_string, "output_dir", None,
          "Directory the script writes to: checkpoints (training resumes from the latest), "
          "TensorBoard logs under train/, feature records and results (eval_results.txt, "
          "predictions); build_vocab: vocab.txt, or spm.model and spm.vocab.")


def define_config_flag():
  """--bert_config_file: the shape of the model."""
  _define(flags.DEFINE_string, "bert_config_file", None,
          "bert_config.json (or HF config.json) of the model; the fine-tuning, feature and "
          "conversion scripts default to the one beside the checkpoint.")


def define_checkpoint_flags():
  """--bert_config_file and --init_checkpoint: the pre-trained model a script starts from."""
  define_config_flag()
  _define(flags.DEFINE_string, "init_checkpoint", None,
          "Pre-trained weights: a Google TF1 checkpoint, a HuggingFace safetensors directory, or "
          "one of this project's checkpoints (a prefix, or a directory: a fine-tuning run's "
          "best checkpoint when it kept one, else its latest).")


def define_litert_model_flag():
  """--litert_model: predict with a LiteRT model directory instead of a checkpoint."""
  _define(flags.DEFINE_string, "litert_model", None,
          "A LiteRT model directory (export_model.py --format=litert, float32 or int8 weights) "
          "to run on the CPU instead of a checkpoint; its vocab.txt, config and casing come with "
          "it (no --init_checkpoint, --bert_config_file or --vocab_file).")


def define_vocab_flag():
  """--vocab_file: the WordPiece vocabulary of a model."""
  _define(flags.DEFINE_string, "vocab_file", None,
          "Vocabulary of the model: a WordPiece vocab.txt, or a SentencePiece .model (what "
          "build_vocab.py --vocab_type=sentencepiece writes); export_model and "
          "convert_checkpoint default to the vocab.txt beside the checkpoint.")


def define_lower_case_flag():
  """--do_lower_case: the casing of a model's text."""
  _define(flags.DEFINE_bool, "do_lower_case", True,
          "Lower-case (and strip accents from) the text before splitting it into word pieces: "
          "True for uncased models, False for cased ones.")


def define_text_flags():
  """The vocabulary and casing of a script that tokenizes text for a model."""
  define_vocab_flag()
  define_lower_case_flag()


def define_max_seq_length(default, minimum=3):
  """--max_seq_length with the script's default (SQuAD windows are longer than sentences) and
  the least length its sequences need ([CLS] a [SEP] is 3)."""
  _define(flags.DEFINE_integer, "max_seq_length", default,
          "Length in WordPiece tokens of every sequence, [CLS] and [SEP] included; how a longer "
          "input is cut is the script's (its docstring says).", lower_bound=2,
          upper_bound=pretraining_data.MAX_SEQ_LENGTH)
  flags.register_validator("max_seq_length", lambda value: value >= minimum,
                           message=f"must be at least {minimum} here")


def define_max_predictions_flag():
  """--max_predictions_per_seq: masked positions per pre-training sequence."""
  _define(flags.DEFINE_integer, "max_predictions_per_seq", 20,
          "Masked LM predictions per sequence (at most; run_pretraining: as in the records).",
          lower_bound=1)


def define_masking_flags():
  """How masked-LM positions are chosen: create_pretraining_data applies them when it writes the
  masks, run_pretraining when it masks records written with --dynamic_masking."""
  _define(flags.DEFINE_bool, "do_whole_word_mask", False,
          "Whether to mask all WordPieces of a word together (the WordPieces are still predicted "
          "one by one).")
  _define(flags.DEFINE_float, "masked_lm_prob", 0.15, "Fraction of tokens to mask, in (0, 1].",
          lower_bound=0.0, upper_bound=1.0)
  _define(flags.DEFINE_string, "mask_split", "80,10,10",
          "What the predicted positions become, in whole percent: [MASK],random token,kept "
          "(BERT's 80,10,10; e.g. 100,0,0 at higher --masked_lm_prob).")


def define_fine_tuning_flags(modes=("train", "eval", "predict"), max_seq_length=128,
                             min_seq_length=3):
  """The flags every fine-tuning script of the original has (run_classifier, run_squad, ...)."""
  define_training_flags(lr_schedule="decay_after_warmup")  # HF-level results (docs/fine-tuning.md)
  define_checkpoint_flags()
  define_text_flags()
  define_max_seq_length(max_seq_length, min_seq_length)
  define_mode_flags(*modes)
  _define(flags.DEFINE_integer, "predict_batch_size", 8, "Global batch size for prediction.",
          lower_bound=1)
  _define(flags.DEFINE_float, "num_train_epochs", 3.0, "Passes over the training data.",
          positive=True)
  _define(flags.DEFINE_float, "warmup_proportion", 0.1,
          "Fraction of training steps with a linear learning-rate warm-up.",
          lower_bound=0.0, upper_bound=1.0)
  _define(flags.DEFINE_string, "hub_module_handle", None,
          "Instead of --init_checkpoint: an encoder SavedModel written by export_model.py (as the "
          "original's run_classifier_with_tfhub.py). Its weights start the encoder; its config, "
          "vocab and casing are used unless --bert_config_file / --vocab_file are given.")
  define_dynamic_padding_flag()
  ## Evaluation during training (dev_evaluation.EvalDuringTraining).
  _define(flags.DEFINE_integer, "eval_every_steps", None,
          "With --do_train: evaluate on dev every N steps (and after the last), logging the dev "
          "metrics and writing them as TensorBoard scalars in output_dir/eval.", lower_bound=1)
  _define(flags.DEFINE_string, "keep_best_checkpoint_metric", None,
          "With --eval_every_steps: keep the checkpoint with the best value of this dev metric "
          "(as in eval_results.txt, with or without eval_: accuracy, f1, mcc, pearson, "
          "macro_f1, exact_match, loss, ...; lower is better for a loss) in output_dir/best/, a "
          "whole model folder; output_dir/best_checkpoint.json records every evaluation. "
          "--do_eval and --do_predict then use it (see --use_best_checkpoint).")
  _define(flags.DEFINE_integer, "early_stopping_patience", None,
          "With --keep_best_checkpoint_metric: stop training after this many evaluations in a "
          "row without improvement of that metric. A rerun resumes with the count it had.",
          lower_bound=1)
  _define(flags.DEFINE_bool, "use_best_checkpoint", True,
          "--do_eval and --do_predict use the best checkpoint of output_dir/best/ when "
          "--keep_best_checkpoint_metric kept one; --nouse_best_checkpoint: the latest.")


def define_data_dir_flag():
  """--data_dir: where a fine-tuning task's files are."""
  _define(flags.DEFINE_string, "data_dir", None,
          "Directory with the task's files: run_classifier a GLUE task's .tsv files, the XNLI "
          "layout or your own task's .tsv/.csv; run_ner the CoNLL train.txt, valid.txt (or "
          "dev.txt) and test.txt; run_swag train.csv, val.csv and test.csv.")


def define_labels_flag():
  """--labels: the output units' names of a classifier or tagger."""
  _define(flags.DEFINE_list, "labels", None,
          "The labels (tags), comma-separated, in the order of the output units (e.g. "
          "'neg,pos'). Default: without --do_train, those the training run saved in output_dir "
          "(task.json); else the task's own: run_classifier's tsv/csv tasks the distinct labels "
          "of the training file, sorted (numerically when all are integers), run_ner "
          "CoNLL-2003's O,B-PER,I-PER,B-ORG,I-ORG,B-LOC,I-LOC,B-MISC,I-MISC; export_model's "
          "classifier those of the task.json beside --init_checkpoint, else 0 .. n-1.")


def define_squad_flags():
  """The question and answer lengths of SQuAD and the answer search (run_squad, and
  export_model's squad model)."""
  _define(flags.DEFINE_integer, "max_query_length", 64,
          "Questions are cut to this many WordPiece tokens.", lower_bound=1)
  _define(flags.DEFINE_integer, "max_answer_length", 30,
          "Longest answer, in WordPiece tokens, that a prediction may have; start and end are "
          "predicted independently, so without a limit a span could cover the whole window.",
          lower_bound=1)
  _define(flags.DEFINE_integer, "n_best_size", 20,
          "How many candidate answers per question to keep (and list in run_squad's "
          "nbest_predictions.json): spans are searched among the n_best_size highest start and "
          "end logits of each window.", lower_bound=1)


def define_pooling_flags():
  """--pooling and --normalize: sentence vectors (extract_features' output, export_model's
  embedder), as sentence-transformers pools."""
  _define(flags.DEFINE_enum, "pooling", "none",
          "Sentence vectors instead of per-token ones: mean (the average over real tokens, "
          "[CLS] and [SEP] included: sentence-transformers' mean pooling), cls (the [CLS] "
          "vector) or max (element-wise over real tokens) of one --layers layer; none: "
          "per-token output (extract_features' default).",
          enum_values=["none", "mean", "cls", "max"])
  _define(flags.DEFINE_bool, "normalize", False,
          "With --pooling: scale each sentence vector to unit L2 norm (sentence-transformers' "
          "normalize_embeddings=True), so that a dot product is the cosine similarity.")


def define_doc_stride_flag(default=None):
  """--doc_stride: texts longer than one sequence read in overlapping windows (run_squad's
  contexts, default 128; run_classifier's and extract_features' long texts, off by default)."""
  _define(flags.DEFINE_integer, "doc_stride", default,
          "Texts longer than one sequence are read in overlapping windows starting this many "
          "WordPiece tokens apart; it must be below the text tokens of a window, so that windows "
          "overlap. run_squad and export_model's squad model: the context's windows (default 128; "
          "export_model: half a window's context tokens when they are 128 or fewer). "
          "run_classifier and extract_features: unset by default, and a longer text is "
          "truncated as in the original; set, the long text (text_b of a pair, else text_a) is "
          "read whole: run_classifier trains on every window with its example's label and "
          "predicts an example from the mean of its windows' probabilities, extract_features "
          "takes each token's vectors from the window where it has the most context.",
          lower_bound=1)


def define_regression_flag():
  """--regression: a classifier whose output is one real number."""
  _define(flags.DEFINE_bool, "regression", False,
          "The label is a real number to predict (like STS-B), not a class (run_classifier: "
          "tsv/csv tasks; export_model: classifier).")


def define_multi_label_flag():
  """--multi_label: a classifier whose examples have any number of labels (sigmoid outputs)."""
  _define(flags.DEFINE_bool, "multi_label", False,
          "Each example has a set of labels, maybe empty (like GoEmotions): one sigmoid output "
          "per label and binary cross-entropy, not a softmax (run_classifier: tsv/csv tasks, "
          "with --label_delimiter; export_model: classifier, default from task.json).")


def define_export_dir_flag():
  """--export_dir: the model directory export_model.py writes and query_model.py reads."""
  _define(flags.DEFINE_string, "export_dir", None,
          "The exported model's directory. export_model.py writes it: an existing one is replaced "
          "only if it holds an earlier export (or with --overwrite). query_model.py reads the "
          "SavedModel there.")


def define_overwrite_flag():
  """--overwrite: replace an existing output that is not the script's own earlier output."""
  _define(flags.DEFINE_bool, "overwrite", False,
          "Replace outputs that already exist even when they hold something other than this "
          "script's earlier output (another model's checkpoint, a non-SavedModel directory); "
          "never one of the inputs.")


def define_input_file_flag():
  """--input_file: a script's input files."""
  _define(flags.DEFINE_string, "input_file", None,
          "Input files: a path, a glob pattern, or a comma-separated list of them. "
          "create_pretraining_data and build_vocab: text, one sentence per line, a blank line "
          "between documents; run_pretraining: create_pretraining_data's TFRecord files; "
          "extract_features: UTF-8 text, one input per line, `text` or `text_a ||| text_b`.")


def define_output_file_flag():
  """--output_file: a script's output file(s), written under a temporary name and renamed."""
  _define(flags.DEFINE_string, "output_file", None,
          "Output, written under a temporary name and renamed when complete. extract_features: "
          "JSON lines, one per input line. create_pretraining_data: TFRecord file(s), either a "
          "comma-separated list of files (records go to them round-robin, as in the original), "
          "or a pattern with a `{shard}` field, e.g. "
          "out/pretrain-{shard:05d}-of-{num_shards:05d}.tfrecord, expanded for shard = 0 .. "
          "--num_output_shards-1, or a directory (an existing one, or a path ending in /) that "
          "gets pretraining-SSSSS-of-NNNNN.tfrecord files.")


def define_dynamic_padding_flag():
  """--dynamic_padding, for the scripts whose outputs do not depend on padding (run_squad cuts
  its prediction batches only: its training loss's span softmax runs over every position,
  padding included, as the original's)."""
  _define(flags.DEFINE_bool, "dynamic_padding", True,
          "Pad each batch only to its longest sequence (rounded up to a multiple of "
          "max_seq_length / 8) instead of to --max_seq_length: the same results with less work "
          "on short texts. --nodynamic_padding gives every batch the full length (TPUs always "
          "get it).")


# --- values ----------------------------------------------------------------------------------------


def settings(cls):
  """A settings record of this run's flags: `cls` is a dataclass whose fields are named after
  flags (training.Settings, fine_tuning.Settings, a script's own subclass of them,
  pretraining_data.Options). A field whose flag the script does not define keeps its default;
  a field `given` gets the names of the flags set on the command line (a default that follows
  a model unless the flag was given)."""
  fields = {field.name for field in dataclasses.fields(cls)}
  values = {name: FLAGS[name].value for name in fields if name in FLAGS}
  if "given" in fields:
    values["given"] = frozenset(name for name in FLAGS if FLAGS[name].present)
  return cls(**values)


def strategy():
  """The tf.distribute strategy named by --distribution_strategy / --use_tpu."""
  from bert_tf2 import devices
  return devices.make_strategy(
      "tpu" if FLAGS.use_tpu else FLAGS.distribution_strategy,
      num_cpu_devices=FLAGS.num_cpu_devices, tpu=FLAGS.tpu_name or FLAGS.master,
      tpu_zone=FLAGS.tpu_zone, gcp_project=FLAGS.gcp_project)


def compute_dtype():
  """--mixed_precision as the dtype of the model's matrix work (devices.compute_dtype)."""
  from bert_tf2 import devices
  return devices.compute_dtype(FLAGS.mixed_precision,
                               tpu=FLAGS.use_tpu or FLAGS.distribution_strategy == "tpu")
