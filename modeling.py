"""The BERT model: configuration, the Transformer encoder and the pre-training heads.

The name the original's users import from a checkout (`import modeling`): every public name of
bert_tf2.modeling, then the original's API over them (bert_tf2/original_api/modeling.py): here
`BertModel(config, is_training, input_ids, ...)` is the original's, with its getters, a front of
the project's model (`bert_tf2.modeling.BertModel`, which the project's own code imports).
"""

from bert_tf2.original_api import quiet_start  # pylint: disable=unused-import
from bert_tf2.modeling import *  # pylint: disable=wildcard-import,unused-wildcard-import
from bert_tf2.original_api.modeling import *  # pylint: disable=wildcard-import,unused-wildcard-import
