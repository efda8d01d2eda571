"""BERT's WordPiece tokenizer (and an ALBERT-style SentencePiece mode) behind one interface.

bert_tf2/tokenization.py, under the name the original's users import from a checkout (`import
tokenization`): every public name of bert_tf2.tokenization, the same objects, plus the original's
module-private character rules its tests call (`_is_whitespace`, `_is_control`,
`_is_punctuation`), which a wildcard import leaves out. The project's own code imports `from
bert_tf2 import tokenization`.
"""

from bert_tf2.tokenization import *  # pylint: disable=wildcard-import,unused-wildcard-import
from bert_tf2.tokenization import (  # pylint: disable=unused-import
    _is_control, _is_punctuation, _is_whitespace)
