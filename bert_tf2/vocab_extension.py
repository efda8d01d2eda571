"""Adding words to a trained model's vocabulary (build_vocab.py --extend_vocab).

A domain corpus is full of words the general vocabulary splits into several pieces ("##ase"
soup for enzymes, say). Adding the most useful of them as whole tokens shortens sequences and
gives each word its own vector, and continued pre-training or fine-tuning then learns them.

- new_tokens: the words of the corpus that the old vocabulary splits, ranked by the pieces they
  would save (count x (pieces - 1)); words the old vocabulary makes [UNK] are left out (nothing to
  start their vector from), so are words the new vocabulary would not produce whole (the
  tokenizer's greedy longest match takes a whole-word entry first, so a listed word always is).
- extend_model: the model with its word-embedding table grown by one row a new token, each the
  mean of the rows of the pieces the old vocabulary split it into, and the masked-LM output bias
  (when the model has the pre-training heads) grown the same way. The new ids come after every
  old one, so every old id, and the output for any text tokenized with the old vocabulary, is
  unchanged.
"""

import numpy as np


# TensorFlow and the modules on it are imported by the functions that grow a model only:
# build_vocab.py ranks the words without it (it starts fast).
# pylint: disable=g-import-not-at-top


def new_tokens(word_counts, tokenizer, count):
  """(token, old pieces) of the `count` words of `word_counts` (BasicTokenizer words -> counts,
  build_vocab.count_words) that save the most pieces, most first; ties by count, then word."""
  scored = []
  for word, n in word_counts.items():
    if word in tokenizer.vocab:
      continue
    pieces = tokenizer.wordpiece_tokenizer.tokenize(word)
    if len(pieces) < 2 or "[UNK]" in pieces:
      continue
    scored.append((-n * (len(pieces) - 1), -n, word, pieces))
  scored.sort()
  return [(word, pieces) for _, _, word, pieces in scored[:count]]


def extend_model(config, init_checkpoint, piece_ids):
  """(extended config, extended model) of the checkpoint: `piece_ids`, one list of old ids a new
  token, gives each new row its start (their mean)."""
  from bert_tf2 import checkpoints
  from bert_tf2 import modeling
  old = checkpoints.load_pretrainer_or_encoder(config, init_checkpoint, log=False)
  grown = modeling.BertConfig.from_dict(dict(config.to_dict(),
                                             vocab_size=config.vocab_size + len(piece_ids)))
  new = (modeling.BertPretrainer(grown) if isinstance(old, modeling.BertPretrainer)
         else checkpoints.EncoderHolder(grown))
  old_variables = checkpoints.variables_by_name(old)
  for name, variable in checkpoints.variables_by_name(new).items():
    value = old_variables[name].numpy()
    if tuple(variable.shape) != value.shape:  # the two tables with a row (entry) per token
      rows = value.reshape(config.vocab_size, -1)
      added = np.stack([rows[ids].astype(np.float64).mean(0) for ids in piece_ids]
                       ).astype(value.dtype)
      value = np.concatenate([rows, added]).reshape(variable.shape)
    variable.assign(value)
  return grown, new
