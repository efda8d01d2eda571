"""The BERT model: configuration, the Transformer encoder and the pre-training heads.

bert_tf2/modeling.py, under the name the original's users import from a checkout (`import
modeling`): every public name of bert_tf2.modeling, the same objects. The project's own code
imports `from bert_tf2 import modeling`.
"""

from bert_tf2.modeling import *  # pylint: disable=wildcard-import,unused-wildcard-import
