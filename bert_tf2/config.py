"""BertConfig: the hyper-parameters of a BERT encoder as the original's `bert_config.json` has
them, their checks (each bad value one error line naming the file and key), and HuggingFace's
`config.json` translated to and from them. Plain values: no TensorFlow."""

import copy
import inspect
import json
import math

from absl import logging

from bert_tf2 import errors
from bert_tf2 import fileio

# hidden_act names (modeling.ACTIVATIONS has their functions). The original's "gelu" is the tanh
# approximation; HuggingFace's "gelu" is the exact erf form. Configs keep the original meaning;
# HF configs are translated on load.
ACTIVATION_NAMES = ("gelu", "gelu_new", "gelu_tanh", "gelu_exact", "relu", "swish", "silu", "tanh",
                    "linear")
_HF_ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_tanh",
                   "relu": "relu", "silu": "silu", "swish": "swish", "tanh": "tanh"}


# Keys a config may carry that do not change this model: the original's unused pooler_* and
# directionality entries, and what HuggingFace's configs add. Any other unknown key is warned about
# (a misspelt `num_hidden_layer` would otherwise silently leave the default of 12 layers).
_IGNORED_KEYS = frozenset((
    "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers", "pooler_size_per_head",
    "pooler_type", "directionality", "_name_or_path", "architectures", "model_type", "torch_dtype",
    "transformers_version", "pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id",
    "position_embedding_type", "use_cache", "classifier_dropout", "gradient_checkpointing",
    "id2label", "label2id", "finetuning_task", "problem_type", "output_past", "tokenizer_class"))
# The sizes that fix the variables' shapes: a config file must give each (a default of BERT-base's
# value for a missing one would build a model that does not match the checkpoint or the data).
_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
          "intermediate_size", "max_position_embeddings", "type_vocab_size")
# Sanity bounds, far above any BERT (BERT-large: hidden 1024, 24 layers, 3.4e8 parameters; the
# largest vocabularies ~1e6). A value beyond is a typo, and building it would exhaust the memory
# or abort the process inside oneDNN instead of ending in a message naming the key.
_MAX_SIZE = {"vocab_size": 2**24, "hidden_size": 2**16, "num_hidden_layers": 2**10,
             "num_attention_heads": 2**12, "intermediate_size": 2**18,
             "max_position_embeddings": 2**20, "type_vocab_size": 2**16}
_MAX_PARAMETERS = 2**33  # 32 GiB of float32 weights, before the optimizer's slots.


class BertConfig:
  """Hyper-parameters of a BERT encoder, as in the original's `bert_config.json`.

  Made as given, like the original's; checked (`validate`) when a model is built from it, or at
  once when read from a file (from_dict / from_json_file, naming it). The checks: the sizes are positive JSON integers (12.0 is refused, not
  rounded: a config is written by hand or by a tool that writes integers, and a float there is
  more likely a mistake than a convenience), dropout probabilities in [0, 1), initializer_range
  and layer_norm_eps positive, and the model within the sanity bounds above.
  """

  def __init__(self, vocab_size, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
               intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
               attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=16,
               initializer_range=0.02, layer_norm_eps=1e-12):
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_hidden_layers = num_hidden_layers
    self.num_attention_heads = num_attention_heads
    self.intermediate_size = intermediate_size
    self.hidden_act = hidden_act
    self.hidden_dropout_prob = hidden_dropout_prob
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.max_position_embeddings = max_position_embeddings
    self.type_vocab_size = type_vocab_size
    self.initializer_range = initializer_range
    self.layer_norm_eps = layer_norm_eps

  def validate(self, source="config"):
    """Raises InputError naming `source` (the config file) and the first bad key."""
    def bad(key, wanted):
      raise errors.InputError(f"{source}: {key} must be {wanted}, got "
                              f"{json.dumps(getattr(self, key), default=repr)}")

    for key in _SIZES:
      value = getattr(self, key)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        bad(key, "a positive integer")
      if value > _MAX_SIZE[key]:
        bad(key, f"at most {_MAX_SIZE[key]} (a sanity bound far above any BERT)")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
      if not _is_number(getattr(self, key)) or not 0 <= getattr(self, key) < 1:
        bad(key, "a probability in [0, 1)")
    for key in ("initializer_range", "layer_norm_eps"):
      if not _is_number(getattr(self, key)) or not 0 < getattr(self, key) < math.inf:
        bad(key, "a positive number")
    if not isinstance(self.hidden_act, str) or self.hidden_act not in ACTIVATION_NAMES:
      bad("hidden_act", f"one of {', '.join(sorted(ACTIVATION_NAMES))}")
    if self.hidden_size % self.num_attention_heads:
      raise errors.InputError(f"{source}: hidden_size {self.hidden_size} is not a multiple of "
                              f"num_attention_heads {self.num_attention_heads}")
    h, layers = self.hidden_size, self.num_hidden_layers
    # The embedding tables, per layer 4 h^2 (query, key, value, output) and 2 h * intermediate
    # (feed-forward), and the pooler; biases and LayerNorms are too few to matter for a bound.
    parameters = ((self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h
                  + layers * (4 * h * h + 2 * h * self.intermediate_size) + h * h)
    if parameters > _MAX_PARAMETERS:
      raise errors.InputError(
          f"{source}: the model would have about {parameters:.2g} parameters (vocab_size "
          f"{self.vocab_size}, hidden_size {h}, num_hidden_layers {layers}, intermediate_size "
          f"{self.intermediate_size}), above the sanity bound of {_MAX_PARAMETERS:.2g}")

  @classmethod
  def from_dict(cls, d, source="config"):
    """From the original's keys. The sizes are required; unknown keys are ignored, with a warning
    unless known to be harmless (pooler_fc_size, directionality, HuggingFace's extras, ...)."""
    signature = inspect.signature(cls.__init__).parameters
    names = [k for k in signature if k != "self"]
    # Warned about first: a misspelt size is then named next to the error for the missing one.
    unknown = sorted(k for k in d if k not in names and k not in _IGNORED_KEYS)
    if unknown:
      logging.warning("%s: unknown key(s) %s in the BERT config are ignored (misspelt?)", source,
                      ", ".join(unknown))
    missing = [k for k in _SIZES if k not in d]
    if missing:  # every one at once: a config written by hand is fixed in one go
      raise errors.InputError(f"{source}: the BERT config has no {', '.join(missing)} (see the "
                              "published sizes in configs/)")
    if d.get("position_embedding_type", "absolute") != "absolute":
      logging.warning("%s: position_embedding_type %r is ignored: this model has absolute "
                      "position embeddings", source, d["position_embedding_type"])
    config = cls.__new__(cls)
    for name in names:
      setattr(config, name, d[name] if name in d else signature[name].default)
    config.validate(source)
    return config

  @classmethod
  def from_hf_dict(cls, d, source="config"):
    """From a HuggingFace `config.json`: same keys, but HF's "gelu" is the exact erf GELU."""
    d = dict(d)
    act = d.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in _HF_ACTIVATIONS:
      raise errors.InputError(f"{source}: HuggingFace hidden_act {act!r} is not supported")
    d["hidden_act"] = _HF_ACTIVATIONS[act]
    return cls.from_dict(d, source)

  @classmethod
  def from_json_file(cls, path):
    """Reads an original `bert_config.json` or a HuggingFace `config.json` (told apart by the
    `model_type` / `architectures` keys that only HF writes)."""
    fileio.check_file(path, "BERT config file")
    try:
      with fileio.open_input(path) as f:
        d = json.load(f)
    except (ValueError, RecursionError) as e:  # JSON syntax, UTF-8, a 5000-digit number, nesting.
      raise errors.InputError(f"{path}: not a JSON config: {e}") from None
    if not isinstance(d, dict):
      raise errors.InputError(f"{path}: a BERT config is a JSON object")
    if "model_type" in d or "architectures" in d:
      return cls.from_hf_dict(d, path)
    return cls.from_dict(d, path)

  def to_dict(self):
    return copy.deepcopy(self.__dict__)

  def to_json_string(self):
    return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

  def to_hf_dict(self):
    d = self.to_dict()
    # Back to HF's names: the original's (tanh) "gelu" is HF's "gelu_new", HF's "gelu" the exact.
    inverse = {"gelu": "gelu_new", "gelu_new": "gelu_new", "gelu_tanh": "gelu_pytorch_tanh",
               "gelu_exact": "gelu"}
    d["hidden_act"] = inverse.get(self.hidden_act, self.hidden_act)
    d.update(model_type="bert", architectures=["BertModel"], pad_token_id=0)
    return d

  def __eq__(self, other):
    return isinstance(other, BertConfig) and self.__dict__ == other.__dict__


def _is_number(value):
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and not (isinstance(value, float) and math.isnan(value)))


