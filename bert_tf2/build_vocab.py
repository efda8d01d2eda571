"""Learns a vocabulary from a corpus: a WordPiece vocab.txt or a SentencePiece model.

The corpus is in the pre-training text format (one sentence per line, blank lines between
documents; only the text matters here). Two kinds, chosen with --vocab_type:

* wordpiece: a BERT `vocab.txt` for tokenization.FullTokenizer. Words are split exactly as the
  tokenizer will split them later (tokenization.BasicTokenizer: cleaning, CJK, punctuation, and
  lower-casing with accent stripping when --do_lower_case), counted, and handed to
  tensorflow-text's WordPiece learner (`wordpiece_tokenizer_learner_lib`, the learner behind
  `bert_vocab_from_dataset`) at the count threshold that gives about --vocab_size tokens (the
  least frequent pieces cut if it gives more). The file starts with [PAD] [UNK] [CLS] [SEP]
  [MASK] (ids 0-4), then --num_unused [unusedN] slots for tokens added later, then every
  character alone and as a "##" continuation (so a word of known characters never becomes
  [UNK]), then the learned pieces by frequency.
* sentencepiece: a SentencePiece unigram model (`spm.model` + `spm.vocab`) trained with the
  sentencepiece library on the text as FullTokenizer(spm_model_file=...) will see it (ALBERT's
  normalisation: whitespace collapsed, accents stripped, lower-cased with --do_lower_case). Its
  first pieces are [PAD] [UNK] [CLS] [SEP] [MASK], so both vocabularies give the special tokens
  the same ids.

With --extend_vocab=OLD_VOCAB (WordPiece), the vocabulary is not learned anew: the
--num_new_tokens words of the corpus that OLD_VOCAB splits into the most pieces (count x pieces
saved) are appended to it as whole tokens (vocab_extension.py), and with --init_checkpoint the
model is written grown to match (OUTPUT_DIR/bert_model.ckpt, bert_config.json, vocab.txt,
vocab_extension.json: one model folder that appears whole or not at all, and replaces only an
empty folder or an earlier extension's, never a corpus, a run or another model): each
new row of the embedding table (and of the masked-LM output bias) the mean of the rows of the
pieces the word was split into, every old id and every output on old-vocabulary text unchanged.
Continue pre-training (run_pretraining.py --init_checkpoint=OUTPUT_DIR/bert_model.ckpt) or
fine-tune from it with --vocab_file=OUTPUT_DIR/vocab.txt.

Outputs are written under temporary names and renamed when complete.
"""

from bert_tf2 import commands  # pylint: disable=g-bad-import-order
from bert_tf2 import fileio  # pylint: disable=g-bad-import-order

import collections
import json
import os
import shutil
import tempfile
import time

from absl import flags
from absl import logging

from bert_tf2 import run_dir
from bert_tf2 import script_flags
from bert_tf2 import tokenization
from bert_tf2 import vocab_extension

FLAGS = flags.FLAGS


def define_flags():
  """The flags of build_vocab.py: the shared groups (script_flags) and its own."""
  script_flags.define_input_file_flag()
  script_flags.define_output_dir_flag()
  flags.DEFINE_enum("vocab_type", "wordpiece", ["wordpiece", "sentencepiece"],
                    "WordPiece OUTPUT_DIR/vocab.txt or SentencePiece unigram model "
                    "OUTPUT_DIR/spm.model (+ spm.vocab).")
  flags.DEFINE_integer("vocab_size", 30522, "Largest vocabulary size, special tokens included.",
                       lower_bound=len(tokenization.SPECIAL_TOKENS) + 1, upper_bound=10**7)
  script_flags.define_lower_case_flag()
  flags.DEFINE_integer("num_unused", 0,
                       "wordpiece: [unused0] ... slots after the special tokens, to fill later.",
                       lower_bound=0)
  flags.DEFINE_integer("max_unique_chars", 1000,
                       "wordpiece: the alphabet: characters beyond the most frequent this many "
                       "are left out (words with them become [UNK]).", lower_bound=1)
  flags.DEFINE_string("extend_vocab", None,
                      "A WordPiece vocab.txt to extend with the corpus' most useful words instead "
                      "of learning a vocabulary (see the module docstring).")
  flags.DEFINE_integer("num_new_tokens", 1000, "With --extend_vocab: words to add at most.",
                       lower_bound=1, upper_bound=10**6)
  script_flags.define_checkpoint_flags()
  script_flags.define_overwrite_flag()
  flags.DEFINE_integer("max_sentences", 0,
                       "Read at most this many lines (0 = all): a large corpus's first part "
                       "is usually enough to learn a vocabulary.", lower_bound=0)


def read_sentences(input_files, max_sentences=0):
  """Yields the non-empty lines of the corpus files (at most `max_sentences` when > 0)."""
  count = 0
  for path in input_files:
    for _, line in fileio.read_lines(path):
      line = line.strip()
      if not line:
        continue
      yield line
      count += 1
      if max_sentences and count >= max_sentences:
        return


def count_words(sentences, do_lower_case):
  """Counter of the words tokenization.BasicTokenizer produces, over all sentences.

  Whitespace-separated words repeat, and BasicTokenizer splits each on its own, so each distinct
  one is split once and its parts weighted by its count (the same counts, many times faster).
  """
  basic = tokenization.BasicTokenizer(do_lower_case=do_lower_case)
  raw = collections.Counter()
  for sentence in sentences:
    raw.update(basic.whitespace_words(sentence))
  words = collections.Counter()
  for word, count in raw.items():
    for part in basic.split_word(word):
      words[part] += count
  return words


def learn_wordpiece(word_counts, vocab_size, num_unused=0, max_unique_chars=1000,
                    source="the corpus"):
  """Word counts -> the vocab as a list of tokens (special tokens first); InputError naming
  `source` when no word is left to learn from."""
  learner = tokenization.wordpiece_learner()
  reserved = list(tokenization.SPECIAL_TOKENS) + [f"[unused{i}]" for i in range(num_unused)]
  if vocab_size <= len(reserved):
    raise fileio.InputError(f"--vocab_size={vocab_size} leaves no room beside the "
                            f"{len(reserved)} reserved tokens")
  if not word_counts:
    raise fileio.InputError(f"{source} has no words")
  params = learner.Params(
      upper_thresh=None, lower_thresh=1, num_iterations=4, max_input_tokens=-1,
      max_token_length=50, max_unique_chars=max_unique_chars, vocab_size=vocab_size,
      slack_ratio=0.05, include_joiner_token=True, joiner="##", reserved_tokens=reserved)
  words = learner.get_input_words(list(word_counts.items()), reserved, params.max_token_length)
  words = learner.filter_input_words(words, learner.get_allowed_chars(words, max_unique_chars),
                                     params.max_input_tokens)
  if not words:
    raise fileio.InputError(
        f"{source} has no word to learn pieces from: the learner skips words over "
        f"{params.max_token_length} characters and words with a character outside the "
        f"--max_unique_chars={max_unique_chars} most frequent, and that leaves none")
  return _fit(_search_threshold(words, params, learner), reserved, vocab_size)


def _search_threshold(words, params, learner):
  """The vocab of the highest count threshold whose vocab still has >= vocab_size tokens.

  The learner's own `learn` bisects thresholds on a linear scale; the vocab size falls roughly
  like a power of the threshold, so bisecting the logarithm needs about half the learning passes
  (each pass costs the same whatever the threshold). The result is cut to size by `_fit`.
  """
  target = params.vocab_size
  sizes = {}

  def vocab_at(threshold):
    if threshold not in sizes:
      sizes[threshold] = learner.learn_with_thresh(words, threshold, params)
      logging.info("count threshold %d: %d tokens", threshold, len(sizes[threshold]))
    return sizes[threshold]

  low, high = 1, max(count for _, count in words) + 1  # size(low) >= target > size(high)
  if len(vocab_at(low)) <= target:
    return vocab_at(low)  # Even every word seen once does not fill the vocab.
  while high - low > 1:
    middle = min(max(int(round((low * high) ** 0.5)), low + 1), high - 1)
    vocab = vocab_at(middle)
    if target * (1 - params.slack_ratio) <= len(vocab) <= target:
      return vocab
    if len(vocab) > target:
      low = middle
    else:
      high = middle
  return vocab_at(low)


def _fit(tokens, reserved, vocab_size):
  """Drops the least frequent learned pieces beyond `vocab_size`.

  The learner lists the reserved tokens, the characters, then the pieces by count. Every
  character alone and as "##" continuation is kept whatever its count: without them some words
  would have no split at all and become [UNK].
  """
  if len(tokens) <= vocab_size:
    return tokens
  characters = [t for t in tokens if t not in reserved and len(t[2:] if t.startswith("##")
                                                                   else t) == 1]
  keep = set(reserved) | set(characters)
  room = vocab_size - len(keep)
  if room < 0:
    raise fileio.InputError(
        f"--vocab_size={vocab_size} is smaller than the {len(keep)} reserved and single-"
        f"character tokens; raise it or lower --max_unique_chars")
  pieces = [t for t in tokens if t not in keep][:room]
  keep.update(pieces)
  return [t for t in tokens if t in keep]


def write_vocab(tokens, path):
  with fileio.naming_output(path), fileio.open_atomic(path) as f:
    f.write("".join(token + "\n" for token in tokens))
  return path


def build_wordpiece(input_files, vocab_file, vocab_size, do_lower_case=True, num_unused=0,
                    max_unique_chars=1000, max_sentences=0):
  """Learns and writes a WordPiece vocab.txt; returns its path."""
  start = time.monotonic()
  counts = count_words(read_sentences(input_files, max_sentences), do_lower_case)
  logging.info("Counted %d distinct words (%d in all) in %.1f s", len(counts),
               sum(counts.values()), time.monotonic() - start)
  tokens = learn_wordpiece(counts, vocab_size, num_unused, max_unique_chars,
                           ", ".join(input_files))
  write_vocab(tokens, vocab_file)
  logging.info("Wrote %s: %d tokens in %.1f s", vocab_file, len(tokens),
               time.monotonic() - start)
  return vocab_file


def build_sentencepiece(input_files, output_dir, vocab_size, do_lower_case=True,
                        max_sentences=0, model_name="spm"):
  """Trains a SentencePiece unigram model; returns the path of `output_dir/spm.model`."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  failures = []

  def sentences():
    # SentencePiece wraps an error raised in its input iterator in a RuntimeError of several
    # lines; keep ours (e.g. invalid UTF-8 naming the file and line) to report as it is.
    try:
      for s in read_sentences(input_files, max_sentences):
        yield tokenization.preprocess_for_sentencepiece(s, do_lower_case)
    except fileio.InputError as e:
      failures.append(e)
      raise

  remote = fileio.is_remote(output_dir)
  if not remote:
    os.makedirs(output_dir, exist_ok=True)
  # Named like fileio's temporaries of the .model file: the next run removes a killed run's. (For
  # a remote output_dir, a local one: SentencePiece writes local files, uploaded by atomic_path.)
  staging = tempfile.mkdtemp(prefix=f".{model_name}.model.tmp-{os.getpid()}-",
                             dir=None if remote else output_dir)
  try:
    prefix = os.path.join(staging, model_name)
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=sentences(), model_prefix=prefix, vocab_size=vocab_size,
          model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
          pad_piece="[PAD]", unk_piece="[UNK]", control_symbols=["[CLS]", "[SEP]", "[MASK]"],
          character_coverage=0.99995, hard_vocab_limit=False, minloglevel=2,
          # Text is normalised beforehand, exactly as FullTokenizer does before encoding.
          normalization_rule_name="identity")
    except RuntimeError as e:
      if failures:
        raise failures[0] from None
      raise fileio.InputError(f"SentencePiece could not learn from {', '.join(input_files)}: "
                              f"{_first_line(e)}") from None
    for extension in ("model", "vocab"):
      path = os.path.join(output_dir, f"{model_name}.{extension}")
      with fileio.naming_output(path), fileio.atomic_path(path) as temporary:
        shutil.move(f"{prefix}.{extension}", temporary)  # os.replace, or a copy across disks
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  path = os.path.join(output_dir, f"{model_name}.model")
  logging.info("Wrote %s", path)
  return path


def _first_line(error):
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def unk_rate(tokenizer, sentences):
  """(fraction of BasicTokenizer words that became [UNK], WordPiece tokens per word)."""
  words = unknown = pieces = 0
  for sentence in sentences:
    for word in tokenizer.basic_tokenizer.tokenize(sentence):
      tokens = tokenizer.wordpiece_tokenizer.split_word(word)
      words += 1
      pieces += len(tokens)
      unknown += tokens == ["[UNK]"]
  return unknown / max(words, 1), pieces / max(words, 1)


def main(argv):
  # A run that fails before writing leaves no new empty --output_dir behind.
  with fileio.no_new_empty_directories(*[FLAGS.output_dir] if FLAGS.output_dir else []):
    _main(argv)


def _main(_):
  logging.set_verbosity(logging.INFO)
  fileio.require(input_file=FLAGS.input_file, output_dir=FLAGS.output_dir)
  input_files = fileio.expand_file_patterns(FLAGS.input_file, "--input_file")
  if FLAGS.extend_vocab:
    if FLAGS.init_checkpoint:
      # Held from the first check to the folder's rename: a second extension into the same folder
      # is refused at once, not after it has grown its own model.
      with fileio.writer_lock(FLAGS.output_dir, "output_dir"):
        _extend(input_files)
    else:
      _extend(input_files)
    return
  if FLAGS.init_checkpoint:
    raise fileio.InputError("--init_checkpoint is for --extend_vocab (a model to grow with its "
                            "vocabulary)")
  vocab_file = run_dir.vocab_file(FLAGS.output_dir)
  if FLAGS.vocab_type == "sentencepiece":
    outputs = [("output_dir", os.path.join(FLAGS.output_dir, f"spm.{extension}"))
               for extension in ("model", "vocab")]
  else:
    outputs = [("output_dir", vocab_file)]
    reserved = len(tokenization.SPECIAL_TOKENS) + FLAGS.num_unused
    if FLAGS.vocab_size <= reserved:
      raise fileio.InputError(f"--vocab_size={FLAGS.vocab_size} leaves no room beside the "
                              f"{reserved} reserved tokens (special ones and --num_unused)")
  # Only the named files are written: an --output_dir holding the corpus is fine, a corpus file
  # named like an output is refused.
  fileio.check_outputs(files=outputs, inputs=[("input_file", input_files)])
  if FLAGS.vocab_type == "sentencepiece":
    path = build_sentencepiece(input_files, FLAGS.output_dir, FLAGS.vocab_size,
                               FLAGS.do_lower_case, FLAGS.max_sentences)
    print(f"SentencePiece model: {path}")
    return
  build_wordpiece(input_files, vocab_file, FLAGS.vocab_size, FLAGS.do_lower_case,
                  FLAGS.num_unused, FLAGS.max_unique_chars, FLAGS.max_sentences)
  tokenizer = tokenization.FullTokenizer(vocab_file, FLAGS.do_lower_case)
  rate, pieces = unk_rate(tokenizer, read_sentences(input_files, FLAGS.max_sentences or 20000))
  print(f"WordPiece vocab: {vocab_file} ({len(tokenizer.vocab)} tokens; on the corpus: "
        f"{100 * rate:.3f}% of words [UNK], {pieces:.2f} pieces per word)")


# What a model folder of --extend_vocab --init_checkpoint holds: only such a folder (or an empty
# one) is replaced by a later extension into it; anything else is refused.
EXTENSION_FILE = "vocab_extension.json"
EXTENSION_FOLDER_FILES = ("vocab.txt", "bert_config.json", "bert_model.ckpt.index",
                          "bert_model.ckpt.data-00000-of-00001", EXTENSION_FILE)


def is_extension_folder(path):
  """True for a folder an earlier `--extend_vocab --init_checkpoint` wrote (its marker file and
  nothing but the files it writes)."""
  names = set(fileio.listdir(path))
  return EXTENSION_FILE in names and names <= set(EXTENSION_FOLDER_FILES)


def _extend(input_files):
  """--extend_vocab: the extended vocab.txt, and with --init_checkpoint the grown model: one model
  folder (OUTPUT_DIR) that appears whole or not at all (fileio.atomic_directory, one writer at a
  time), never over a folder holding anything but an earlier extension."""
  if FLAGS.vocab_type != "wordpiece":
    raise fileio.InputError("--extend_vocab extends a WordPiece vocab.txt (--vocab_type="
                            "wordpiece)")
  vocab_file = run_dir.vocab_file(FLAGS.output_dir)
  fileio.check_file(FLAGS.extend_vocab, "--extend_vocab")
  if tokenization.is_sentencepiece_model(FLAGS.extend_vocab):
    raise fileio.InputError(f"--extend_vocab={FLAGS.extend_vocab} is a SentencePiece model; "
                            "--extend_vocab grows a WordPiece vocab.txt (a SentencePiece model "
                            "is trained anew: --vocab_type=sentencepiece)")
  tokenizer = tokenization.load_tokenizer(FLAGS.extend_vocab, FLAGS.do_lower_case)
  inputs = [("input_file", input_files), ("extend_vocab", FLAGS.extend_vocab)]
  if FLAGS.init_checkpoint:
    from bert_tf2 import checkpoints  # pylint: disable=g-import-not-at-top
    from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
    config_path = checkpoints.config_path(FLAGS.bert_config_file, FLAGS.init_checkpoint)
    inputs += [("init_checkpoint", checkpoints.checkpoint_files(FLAGS.init_checkpoint)),
               ("bert_config_file", config_path)]
    fileio.check_outputs(replaced_directories=[("output_dir", FLAGS.output_dir)], inputs=inputs)
    _check_replaceable(FLAGS.output_dir)
    config = modeling.BertConfig.from_json_file(config_path)
    tokenization.check_vocab_fits(len(tokenizer.vocab), config, FLAGS.extend_vocab, config_path)
    if len(tokenizer.vocab) != config.vocab_size:
      # New ids must come right after the model's rows, or they would land on unused ones.
      raise fileio.InputError(
          f"--extend_vocab={FLAGS.extend_vocab} has {len(tokenizer.vocab)} tokens but the model "
          f"has vocab_size={config.vocab_size}: extend the vocab the model was trained with")
  else:
    fileio.check_outputs(files=[("output_dir", vocab_file)], inputs=inputs)
  counts = count_words(read_sentences(input_files, FLAGS.max_sentences), FLAGS.do_lower_case)
  added = vocab_extension.new_tokens(counts, tokenizer, FLAGS.num_new_tokens)
  if not added:
    raise fileio.InputError(f"no word of {', '.join(input_files)} is split by --extend_vocab="
                            f"{FLAGS.extend_vocab} into known pieces: nothing to add")
  # The vocab's own line reader: a token holding a form feed, U+2028 or U+0085 stays one line
  # (str.splitlines would break there and shift every later id).
  old_lines = [line for _, line in fileio.read_lines(FLAGS.extend_vocab)]
  lines = old_lines + [word for word, _ in added]
  saved = sum(counts[word] * (len(pieces) - 1) for word, pieces in added)
  total = sum(counts[word] * len(tokenizer.wordpiece_tokenizer.tokenize(word)) for word in counts)
  summary = (f"({len(old_lines)} + {len(added)} tokens; on the corpus "
             f"{100 * saved / max(total, 1):.1f}% fewer WordPieces)")
  if not FLAGS.init_checkpoint:
    write_vocab(lines, vocab_file)
    print(f"Extended vocab: {vocab_file} {summary}")
    return
  piece_ids = [tokenizer.convert_tokens_to_ids(pieces) for _, pieces in added]
  grown, model = vocab_extension.extend_model(config, FLAGS.init_checkpoint, piece_ids)
  with fileio.atomic_directory(FLAGS.output_dir, replaceable=is_extension_folder,
                               overwrite=FLAGS.overwrite, flag="output_dir") as staging:
    write_vocab(lines, run_dir.vocab_file(staging))
    prefix = os.path.join(staging, "bert_model.ckpt")
    checkpoints.export_tf1_checkpoint(model, prefix, grown)  # + bert_config.json beside
    with fileio.open_atomic(os.path.join(staging, EXTENSION_FILE)) as f:
      json.dump({"extend_vocab": fileio.absolute(FLAGS.extend_vocab),
                 "init_checkpoint": fileio.absolute(FLAGS.init_checkpoint),
                 "old_vocab_size": config.vocab_size, "new_tokens": len(added),
                 "vocab_size": grown.vocab_size}, f, indent=2)
      f.write("\n")
  prefix = os.path.join(FLAGS.output_dir, "bert_model.ckpt")
  print(f"Extended vocab: {vocab_file} {summary}")
  print(f"Extended model: {prefix} (vocab_size {config.vocab_size} -> {grown.vocab_size})")


def _check_replaceable(output_dir):
  """The refusal atomic_directory makes at the end, made before the corpus is read and the model
  grown: a folder holding anything but an earlier extension (a corpus, a fine-tuning run, another
  model) is never replaced without --overwrite."""
  if FLAGS.overwrite or not fileio.exists(output_dir):
    return
  if not fileio.isdir(output_dir):
    raise fileio.InputError(f"--output_dir={output_dir} exists and is not a directory")
  if fileio.listdir(output_dir) and not is_extension_folder(output_dir):
    raise fileio.InputError(
        f"--output_dir={output_dir} holds files that are not an earlier --extend_vocab model "
        f"folder ({', '.join(sorted(fileio.listdir(output_dir))[:3])}, ...); with "
        "--init_checkpoint it becomes one model folder (vocab.txt, bert_config.json, "
        "bert_model.ckpt.*): choose a new or empty directory, or pass --overwrite to replace it")


def cli():
  """The command line: `python build_vocab.py` and the `bert-build-vocab` command."""
  define_flags()
  commands.run_main(main)
