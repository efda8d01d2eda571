"""The training step's low-precision copies of the weights (issue #52).

A bfloat16 (or float16) model keeps its variables in float32 and used to cast each matrix to
its compute dtype at every use, in every step: on BERT-base 110 M parameters read (4 bytes) and
written (2 bytes) again each step, 5% of a bf16 pre-training step's op time on a Xeon with AMX.
`WeightCopies` holds one compute-dtype variable per float32 variable the model reads in its
compute dtype. The optimizer's compiled update writes it with the new float32 weight, and the
model reads it as it stands, with no cast. (XLA's CPU compiler writes the copy in a loop of its
own, 4 bytes read and 2 written a parameter, what the cast cost: on CPU the step gained 1.02x,
from the gradients' side; benchmarks/log/2026-11-29.md. A compiler that fuses several outputs into
one loop writes it for 2 bytes.)

Copies are made fresh (`refresh`) at the start of every training loop call, so whatever changed
the float32 weights in between (a restored checkpoint, an initialisation, another program step)
is seen; inside the loop only the optimizer changes them, and it writes the copies too. They are
not in any checkpoint (the float32 variables are the weights; a copy is their rounding).

The training step takes the gradient with respect to the copies (the compute-dtype gradient the
matmuls produce; the float32 cast's gradient was the same numbers cast back) and hands it to the
optimizer as it is, whose update casts it inside its compiled pass: the same values as before.
"""

import tensorflow as tf

from bert_tf2 import modeling


class WeightCopies:
  """Compute-dtype copies of the float32 variables a model reads in its compute dtype.

  It answers the model's `inference_weights` protocol (`get`, `bf16_softmax`), so a model called
  with it as `inference_weights` reads the copies (a fused query / key / value matrix is the
  concatenation of its members' copies) wherever it would cast a variable."""

  # Training's softmax stays in float32 (see kernels.masked_softmax); its LayerNorm is the
  # compiled pair (kernels.layer_norm).
  bf16_softmax = False
  onednn_layer_norm = False

  def __init__(self, pairs, dtype):
    """`pairs`: (float32 variable, its copy) each."""
    self.dtype = dtype
    self._copies = {variable.ref(): copy for variable, copy in pairs}

  @classmethod
  def for_training(cls, model, variables, dtype):
    """Copies in `dtype` of those of `variables` (the trained ones) that `model` reads through
    modeling's weight groups, or None when there is nothing to copy (a float32 model). Create it
    under the strategy's scope."""
    if dtype == tf.float32:
      return None
    read = {v.ref() for v in _weights_read(model)}
    pairs = [(v, tf.Variable(tf.cast(v, dtype), trainable=False, name=f"copy_{i}"))
             for i, v in enumerate(variables) if v.ref() in read and v.dtype == tf.float32]
    return cls(pairs, dtype) if pairs else None

  def copy_of(self, variable):
    """The copy of `variable`, or None."""
    return self._copies.get(variable.ref())

  def refresh(self):
    """Writes every copy from its variable (a replica's own, under a strategy)."""
    for ref, copy in self._copies.items():
      copy.assign(tf.cast(ref.deref(), self.dtype))

  def get(self, variables, dtype, axis=0, transposed=False):
    """The copies of `variables` (concatenated along `axis`) when each has one in `dtype`,
    else None (the model then casts). Held in the variables' layout only: None to
    transposed=True (a gradient of a transposed copy would need transposing back)."""
    if transposed or dtype != self.dtype:
      return None
    copies = [self._copies.get(v.ref()) for v in variables]
    if any(c is None for c in copies):
      return None
    reads = [tf.convert_to_tensor(c) for c in copies]
    return reads[0] if len(reads) == 1 else tf.concat(reads, axis)


def compute_dtype(model):
  """The compute dtype of `model`'s one BertModel (float32 when it has none or several)."""
  berts = [m for m in (model, *model.submodules) if isinstance(m, modeling.BertModel)]
  return berts[0].compute_dtype if len(berts) == 1 else tf.float32


def _weights_read(model):
  """The variables `model`'s modules read in the compute dtype through `weight_groups`."""
  for module in (model, *model.submodules):
    for variables, _ in getattr(module, "weight_groups", lambda: ())():
      yield from variables
