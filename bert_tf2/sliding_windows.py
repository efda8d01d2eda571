"""Overlapping windows over a text longer than one sequence, and the window that reads each token
with the most context.

run_squad.py cuts a context into windows ([CLS] question [SEP] window [SEP]); run_classifier.py and
extract_features.py with --doc_stride cut a long text the same way (`sequence_windows`: the
original's [CLS] a [SEP] (b [SEP]) layout, text_b windowed in a pair, text_a alone). Windows start
`stride` tokens apart, so a token sits in up to max_tokens / stride of them; where one answer per
token is wanted, it comes from the window where the token has the most context (`max_context`).
Plain Python values in and out; export_model.py's SQuAD model repeats these rules in TF ops.
"""

import collections

from bert_tf2 import errors
from bert_tf2 import tokenization

# A window over tokens start .. start + length - 1 of a text.
Span = collections.namedtuple("Span", ["start", "length"])


def spans(num_tokens, max_tokens, stride):
  """The windows over `num_tokens` tokens, as run_squad.py (and the original) cuts a context: at
  most `max_tokens` long, each starting `stride` tokens after the previous one (or right after
  it, when the window is shorter than the stride), the last ending at the last token. No tokens:
  no window. ValueError unless both `max_tokens` and `stride` are at least 1: with either below,
  the next window would start where the last one did, and the loop would never end."""
  if max_tokens < 1 or stride < 1:
    raise ValueError(f"windows need max_tokens and stride of at least 1, not {max_tokens} and "
                     f"{stride}")
  result = []
  start = 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens)
    result.append(Span(start, length))
    if start + length == num_tokens:
      break
    # min: with a stride longer than the window, windows meet rather than skip tokens.
    start += min(length, stride)
  return result


def max_context(spans_, position):
  """The index of the span in `spans_` where token `position` has the most context (None when
  no span holds it).

  With overlapping windows a token is read in several of them; the one that counts is where its
  context is largest, taken as the minimum of its left and right context (their sum is the same
  in every full window) plus 0.01 times the window's length, so that a longer window wins a tie;
  on an equal score the first window.
  """
  best_score = None
  best_index = None
  for index, span in enumerate(spans_):
    end = span.start + span.length - 1
    if not span.start <= position <= end:
      continue
    # E.g. windows "to the store and bought" and "and bought a gallon of": "bought" has 4 tokens
    # before it and 0 after in the first (score 0), 1 and 3 in the second (score 1), which wins:
    # a token at a window's edge is read without the context on one side.
    score = min(position - span.start, end - position) + 0.01 * span.length
    if best_score is None or score > best_score:
      best_score = score
      best_index = index
  return best_index


def check_stride(doc_stride, window, what):
  """InputError unless --doc_stride is below the `window` tokens a window holds (`what` says
  which tokens and why that many): with a stride as long as the window, windows would only
  meet, and with a longer one skip text."""
  if doc_stride >= window:
    raise errors.InputError(f"--doc_stride={doc_stride} must be below the {window} {what}, or "
                            "windows would not overlap")


def sequence_windows(tokens_a, tokens_b, max_seq_length, doc_stride=None):
  """How a text (`tokens_b` empty) or a pair is read as [CLS] a [SEP] (b [SEP]) sequences of at
  most `max_seq_length` tokens: (a, b, spans), a and b the tokens kept and `spans` the windows
  over the windowed text, b (or a, without b). `window_tokens` gives each window's sequence.

  When the text fits, or without `doc_stride`, there is one window, cut as the original cuts:
  tokenization.truncate_seq_pair for a pair (the longer text loses tokens until both fit), the
  text's first max_seq_length - 2 tokens otherwise. With `doc_stride` a longer text is read
  whole in windows `doc_stride` tokens apart (`spans`): a single text in windows of
  max_seq_length - 2 tokens; in a pair text_b, after the text_a that truncate_seq_pair would keep
  (all of it when it is no longer than b's share), in windows of the tokens left. Only text_b is
  windowed: text_a longer than its share is truncated all the same.

  A pair with a budget of one token (max_seq_length 4) keeps at most a token of a and none of
  b, so no window could read b: it is cut as without `doc_stride`. A pair cut to no b reads as
  the original writes it, [CLS] a [SEP] (no second [SEP]; its one span is over a).
  """
  pair = bool(tokens_b)
  budget = max_seq_length - (3 if pair else 2)  # [CLS], [SEP] (and the second [SEP])
  a, b = list(tokens_a), list(tokens_b)
  if not pair:
    if doc_stride is None or len(a) <= budget:
      a = a[:budget]
      return a, b, [Span(0, len(a))]
    return a, b, spans(len(a), budget, doc_stride)
  kept_b = list(b)
  tokenization.truncate_seq_pair(a, kept_b, budget)
  # The windows over b hold budget - len(a) >= len(kept_b) tokens: at least one while
  # truncate_seq_pair leaves b a token, which it does for any budget of 2 or more.
  # One window: b fits beside a, or truncation left it no token for a window to read.
  if doc_stride is None or len(kept_b) == len(b) or not kept_b:
    return a, kept_b, [Span(0, len(kept_b) if kept_b else len(a))]
  # a as truncate_seq_pair kept it; b whole, in windows of the room a leaves.
  return a, b, spans(len(b), budget - len(a), doc_stride)


def window_tokens(a, b, span):
  """(tokens, segment ids) of the window `span` of `sequence_windows`' (a, b, spans): [CLS] a
  [SEP] (b [SEP]) with its windowed text cut to the span; segment 0 up to the first [SEP], 1
  after it."""
  if b:
    b = b[span.start:span.start + span.length]
  else:
    a = a[span.start:span.start + span.length]
  tokens = ["[CLS]", *a, "[SEP]"]
  segment_ids = [0] * len(tokens)
  if b:
    tokens += [*b, "[SEP]"]
    segment_ids += [1] * (len(b) + 1)
  return tokens, segment_ids
