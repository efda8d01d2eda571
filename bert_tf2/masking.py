"""What a masked-LM prediction's input becomes: [MASK], a random token, or the token itself.

BERT replaces 80% of the predicted positions with [MASK], 10% with a random token and keeps 10%:
[MASK] never occurs in fine-tuning, so the model also learns to predict at real tokens (random
ones, and unchanged ones, which tie the representation to the observed word). Later recipes
change the split: 100% [MASK] with higher masking rates (Wettig et al., "Should you mask 15% in
masked language modeling?", 2023), or 80/10/10 kept at 30-40%. `--mask_split=MASK,RANDOM,KEEP`,
in whole percent summing to 100, sets it wherever masks are drawn: create_pretraining_data's
static masks (both modes) and run_pretraining's dynamic ones. In whole percent, so that the
default's thresholds are exactly the original's (0.8, and 0.5 of the rest in exact mode): its
records stay byte-identical.
"""

import dataclasses

from bert_tf2 import errors

DEFAULT = "80,10,10"


@dataclasses.dataclass(frozen=True)
class MaskSplit:
  """Percent of predicted positions that become [MASK], a random token, or stay."""
  mask: int = 80
  random: int = 10
  keep: int = 10

  @classmethod
  def parse(cls, text, flag="mask_split"):
    """`MASK,RANDOM,KEEP` (whole percent, summing to 100); InputError naming the flag."""
    parts = [part.strip() for part in str(text).split(",")]
    if len(parts) != 3 or not all(part.isascii() and part.isdigit() for part in parts):
      raise errors.InputError(f"--{flag}={text}: give MASK,RANDOM,KEEP in whole percent, e.g. "
                              f"{DEFAULT} (BERT's) or 100,0,0")
    split = cls(*map(int, parts))
    if split.mask + split.random + split.keep != 100:
      raise errors.InputError(f"--{flag}={text}: the three percentages sum to "
                              f"{split.mask + split.random + split.keep}, not 100")
    return split

  @property
  def mask_below(self):
    """A uniform draw below this makes the position [MASK]."""
    return self.mask / 100

  @property
  def random_below(self):
    """... else below this (and at least mask_below), a random token."""
    return (self.mask + self.random) / 100

  @property
  def keep_of_rest(self):
    """Exact mode's second draw (the original's stream): of the positions not made [MASK], a
    draw below this keeps the token, at or above it takes a random one (0.5 in BERT)."""
    rest = self.random + self.keep
    return self.keep / rest if rest else 1.0

  def __str__(self):
    return f"{self.mask},{self.random},{self.keep}"
