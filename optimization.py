"""Optimizers and the learning-rate schedule of the original, as tf.Modules (checkpointable).

The name the original's users import from a checkout (`import optimization`): every public name
of bert_tf2.optimization, then the original's API over them (bert_tf2/original_api/
optimization.py): `AdamWeightDecayOptimizer` and the original's `create_optimizer(loss, init_lr,
num_train_steps, num_warmup_steps, use_tpu)`. The project's own code imports
`from bert_tf2 import optimization`.
"""

from bert_tf2.original_api import quiet_start  # pylint: disable=unused-import
from bert_tf2.optimization import *  # pylint: disable=wildcard-import,unused-wildcard-import
from bert_tf2.original_api.optimization import *  # pylint: disable=wildcard-import,unused-wildcard-import
