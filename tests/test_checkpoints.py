"""Original Google TF1 checkpoints load by name; exports round-trip through TF1 and HF formats."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_tf2 import checkpoints
from bert_tf2 import fileio
from bert_tf2 import modeling
from conftest import TINY, minilm_dir, requires_shared



def _features():
  return {"input_ids": tf.constant([[2, 5, 6, 7, 3, 8, 9, 3], [2, 10, 11, 3, 12, 13, 3, 0]]),
          "input_mask": tf.constant([[1] * 8, [1] * 7 + [0]]),
          "segment_ids": tf.constant([[0] * 5 + [1] * 3, [0] * 4 + [1] * 3 + [0]]),
          "masked_lm_positions": tf.constant([[1, 6], [2, 5]])}


def _load_tiny():
  config = modeling.BertConfig.from_json_file(os.path.join(TINY, "bert_config.json"))
  model = modeling.BertPretrainer(config)
  report = checkpoints.init_from_checkpoint(model, os.path.join(TINY, "bert_model.ckpt"))
  return config, model, report


@requires_shared
def test_tiny_tf1_checkpoint_loads_every_variable_by_name():
  _, model, report = _load_tiny()
  reader = tf.train.load_checkpoint(os.path.join(TINY, "bert_model.ckpt"))
  model_names = set(checkpoints.variables_by_name(model))
  assert len(model_names) == 46 and set(report.loaded) == model_names
  assert report.missing == [] and report.unused == []  # adam slots and global_step are skipped
  for name, variable in checkpoints.variables_by_name(model).items():
    np.testing.assert_array_equal(variable.numpy(), reader.get_tensor(name))


@requires_shared
def test_export_tf1_then_reload_gives_identical_outputs(tmp_path):
  config, model, _ = _load_tiny()
  before = model(_features())
  prefix = str(tmp_path / "export" / "bert_model.ckpt")
  checkpoints.export_tf1_checkpoint(model, prefix, config=config,
                                    vocab_file=os.path.join(TINY, "vocab.txt"), global_step=7)
  names = dict(tf.train.list_variables(prefix))
  assert names["bert/encoder/layer_1/attention/self/query/kernel"] == [4, 4]
  assert names["cls/predictions/output_bias"] == [15] and "global_step" in names
  assert sorted(os.listdir(tmp_path / "export")) == [
      "bert_config.json", "bert_model.ckpt.data-00000-of-00001", "bert_model.ckpt.index",
      "vocab.txt"]
  reloaded = modeling.BertPretrainer(modeling.BertConfig.from_json_file(
      str(tmp_path / "export" / "bert_config.json")))
  checkpoints.init_from_checkpoint(reloaded, str(tmp_path / "export"))
  after = reloaded(_features())
  for key in ("sequence_output", "pooled_output", "masked_lm_log_probs",
              "next_sentence_log_probs"):
    np.testing.assert_array_equal(before[key].numpy(), after[key].numpy())


@requires_shared
def test_tf1_to_hf_to_tf1_round_trip_is_identical(tmp_path):
  config, model, _ = _load_tiny()
  checkpoints.export_hf_checkpoint(model, str(tmp_path / "hf"), config=config)
  from safetensors.numpy import load_file
  keys = set(load_file(str(tmp_path / "hf" / "model.safetensors")))
  assert "bert.encoder.layer.1.attention.self.query.weight" in keys
  assert "cls.predictions.bias" in keys and "cls.seq_relationship.weight" in keys
  hf_model = modeling.BertPretrainer(modeling.BertConfig.from_json_file(
      str(tmp_path / "hf" / "config.json")))
  report = checkpoints.init_from_checkpoint(hf_model, str(tmp_path / "hf"))
  assert not report.missing and not report.unused
  checkpoints.export_tf1_checkpoint(hf_model, str(tmp_path / "back" / "bert_model.ckpt"))
  original = tf.train.load_checkpoint(os.path.join(TINY, "bert_model.ckpt"))
  back = tf.train.load_checkpoint(str(tmp_path / "back" / "bert_model.ckpt"))
  for name in checkpoints.variables_by_name(model):
    np.testing.assert_array_equal(back.get_tensor(name), original.get_tensor(name))


@requires_shared
def test_project_checkpoint_initialises_the_encoder_of_another_model(tmp_path):
  _, model, _ = _load_tiny()
  ckpt = tf.train.Checkpoint(model=model)
  path = ckpt.write(str(tmp_path / "ckpt-1"))
  encoder = modeling.BertModel(model.bert.config)
  holder = tf.Module()
  holder.bert = encoder
  report = checkpoints.init_from_checkpoint(holder, path)
  assert not report.missing and report.unused  # the cls heads are not in `holder`
  np.testing.assert_array_equal(encoder.embedding_table.numpy(),
                                model.bert.embedding_table.numpy())


@requires_shared
def test_shape_mismatch_names_the_variable_and_both_shapes():
  config = modeling.BertConfig.from_json_file(os.path.join(TINY, "bert_config.json"))
  config.intermediate_size = 8
  model = modeling.BertPretrainer(config)
  with pytest.raises(fileio.InputError,
                     match=r"bert/encoder/layer_0/intermediate/dense/bias has shape \[16\] in the "
                           r"checkpoint but \[8\] in the model"):
    checkpoints.init_from_checkpoint(model, os.path.join(TINY, "bert_model.ckpt"))


def test_missing_checkpoint_is_a_clear_error(tmp_path):
  model = modeling.BertModel(modeling.BertConfig(vocab_size=10, hidden_size=4,
                                                 num_attention_heads=1, num_hidden_layers=1))
  with pytest.raises(fileio.InputError, match="checkpoint not found"):
    checkpoints.init_from_checkpoint(model, str(tmp_path / "nope.ckpt"))
  with pytest.raises(fileio.InputError, match="no checkpoint found in directory"):
    checkpoints.init_from_checkpoint(model, str(tmp_path))


def _damaged_copy(tmp_path, name, damage):
  """A copy of the tiny checkpoint in tmp_path/name with `damage(directory)` applied."""
  directory = tmp_path / name
  directory.mkdir()
  for file in ("bert_config.json", "vocab.txt", "bert_model.ckpt.index",
               "bert_model.ckpt.data-00000-of-00001"):
    (directory / file).write_bytes(open(os.path.join(TINY, file), "rb").read())
    os.chmod(directory / file, 0o644)
  damage(directory)
  return str(directory / "bert_model.ckpt")


def _truncate(path, size):
  with open(path, "r+b") as f:
    f.truncate(size)


def _flip(path, offset):
  data = bytearray(open(path, "rb").read())
  data[offset:offset + 8] = bytes(b ^ 0xFF for b in data[offset:offset + 8])
  open(path, "wb").write(data)


@requires_shared
@pytest.mark.parametrize("damage,detail", [
    (lambda d: _truncate(d / "bert_model.ckpt.index", 500), "not an sstable"),
    (lambda d: _truncate(d / "bert_model.ckpt.data-00000-of-00001", 1000), "Read less bytes"),
    (lambda d: _flip(d / "bert_model.ckpt.data-00000-of-00001", 100), "Checksum does not match"),
    (lambda d: os.remove(d / "bert_model.ckpt.data-00000-of-00001"), ""),
])
def test_damaged_checkpoint_is_an_input_error_naming_its_files(tmp_path, damage, detail):
  prefix = _damaged_copy(tmp_path, "ckpt", damage)
  config = modeling.BertConfig.from_json_file(os.path.join(TINY, "bert_config.json"))
  with pytest.raises(fileio.InputError) as error:
    checkpoints.init_from_checkpoint(modeling.BertPretrainer(config), prefix)
  message = str(error.value)
  assert message.startswith(f"checkpoint {prefix} is damaged or incomplete ({prefix}.index, "
                            f"{prefix}.data-00000-of-00001): "), message
  assert detail in message and "\n" not in message


def test_truncated_safetensors_is_an_input_error_naming_the_file(tmp_path):
  source = os.path.join(minilm_dir(), "model.safetensors")
  config = modeling.BertConfig.from_json_file(os.path.join(minilm_dir(), "config.json"))
  for size in (4, 100_000):
    path = tmp_path / f"cut{size}" / "model.safetensors"
    path.parent.mkdir()
    with open(source, "rb") as f:
      path.write_bytes(f.read(size))
    with pytest.raises(fileio.InputError, match=f"^{path}: not a readable safetensors file"):
      checkpoints.init_from_checkpoint(modeling.BertModel(config), str(path.parent))


@requires_shared
def test_checkpoint_files_lists_what_a_checkpoint_is_read_from(tmp_path):
  prefix = os.path.join(TINY, "bert_model.ckpt")
  expected = [prefix + ".index", prefix + ".data-00000-of-00001"]
  assert checkpoints.checkpoint_files(prefix) == expected
  assert checkpoints.checkpoint_files(TINY) == expected


def test_a_mistyped_checkpoint_path_is_named_not_a_missing_config(tmp_path):
  """A wrong --init_checkpoint (no such folder or prefix) says so; it used to end in
  "--bert_config_file is required", which sent users looking for the wrong thing."""
  missing = str(tmp_path / "nope" / "bert_model.ckpt")
  with pytest.raises(fileio.InputError,
                     match=r"--init_checkpoint=.*nope/bert_model\.ckpt: no checkpoint there"):
    checkpoints.config_path(None, missing)
  (tmp_path / "model").mkdir()  # a real folder without a config: the config is what is missing
  with pytest.raises(fileio.InputError, match="--bert_config_file is required"):
    checkpoints.config_path(None, str(tmp_path / "model"))
  (tmp_path / "model" / "bert_model.ckpt.index").write_bytes(b"")
  with pytest.raises(fileio.InputError, match="--bert_config_file is required"):
    checkpoints.config_path(None, str(tmp_path / "model" / "bert_model.ckpt"))


def test_sentence_transformers_pooling_is_read_from_the_models_folder(tmp_path):
  """all-MiniLM-L6-v2 (the README's model) pools the mean of its token vectors; a folder with
  another single mode says it; none, several, an unknown mode, a damaged file: None."""
  minilm = minilm_dir()
  assert checkpoints.sentence_transformers_pooling(minilm) == "mean"
  assert checkpoints.sentence_transformers_pooling(os.path.join(minilm, "model.safetensors")) \
      == "mean"
  assert checkpoints.sentence_transformers_pooling(TINY) is None
  assert checkpoints.sentence_transformers_pooling("") is None

  def folder(name, modules, config):
    path = tmp_path / name
    (path / "pool").mkdir(parents=True)
    (path / "modules.json").write_text(modules)
    (path / "pool" / "config.json").write_text(config)
    return str(path)

  modules = json.dumps([{"path": "", "type": "sentence_transformers.models.Transformer"},
                        {"path": "pool", "type": "sentence_transformers.models.Pooling"}])
  mode = lambda **on: json.dumps({"word_embedding_dimension": 8, "pooling_mode_cls_token": False,
                                  "pooling_mode_mean_tokens": False, **on})
  assert checkpoints.sentence_transformers_pooling(
      folder("cls", modules, mode(pooling_mode_cls_token=True))) == "cls"
  assert checkpoints.sentence_transformers_pooling(
      folder("max", modules, mode(pooling_mode_max_tokens=True))) == "max"
  assert checkpoints.sentence_transformers_pooling(
      folder("two", modules, mode(pooling_mode_cls_token=True,
                                  pooling_mode_mean_tokens=True))) is None
  assert checkpoints.sentence_transformers_pooling(
      folder("sqrt", modules, mode(pooling_mode_mean_sqrt_len_tokens=True))) is None
  assert checkpoints.sentence_transformers_pooling(folder("none", modules, mode())) is None
  assert checkpoints.sentence_transformers_pooling(
      folder("damaged", modules[:20], mode(pooling_mode_cls_token=True))) is None
  assert checkpoints.sentence_transformers_pooling(
      folder("no_pooling", json.dumps([{"path": "", "type": "x.Transformer"}]),
             mode(pooling_mode_cls_token=True))) is None
