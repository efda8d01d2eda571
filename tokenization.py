"""BERT's WordPiece tokenizer (and an ALBERT-style SentencePiece mode) behind one interface.

bert_tf2/tokenization.py, under the name the original's users import from a checkout (`import
tokenization`): every public name of bert_tf2.tokenization, the same objects. The project's own code
imports `from bert_tf2 import tokenization`.
"""

from bert_tf2.tokenization import *  # pylint: disable=wildcard-import,unused-wildcard-import
