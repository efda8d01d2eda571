"""Optimizers and the learning-rate schedule of the original, as tf.Modules (checkpointable).

bert_tf2/optimization.py, under the name the original's users import from a checkout (`import
optimization`): every public name of bert_tf2.optimization, the same objects. The project's own code
imports `from bert_tf2 import optimization`.
"""

from bert_tf2.optimization import *  # pylint: disable=wildcard-import,unused-wildcard-import
