"""convert_checkpoint.py: Google TF1 -> HF -> project -> Google TF1 keeps every tensor exactly,
with the config and vocab alongside."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY, requires_shared, run_ok, run_script
from bert_tf2 import checkpoints
from bert_tf2 import convert_checkpoint
from bert_tf2 import fileio
from bert_tf2 import modeling



def _model_tensors(prefix):
  """The model's tensors of a name-based checkpoint (optimizer slots and step left out)."""
  reader = tf.train.load_checkpoint(prefix)
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
          if not checkpoints._is_optimizer_slot(name)}


@requires_shared
def test_round_trip_tf1_hf_project_tf1_is_identical(tmp_path):
  original = _model_tensors(os.path.join(TINY, "bert_model.ckpt"))
  assert len(original) == 46 and any(n.startswith("cls/") for n in original)
  hf, project, back = tmp_path / "hf", tmp_path / "project", tmp_path / "tf1"
  run_ok(["convert_checkpoint.py", f"--input={TINY}/bert_model.ckpt", f"--output={hf}",
          "--output_format=hf"])
  assert sorted(os.listdir(hf)) == ["config.json", "model.safetensors", "vocab.txt"]
  run_ok(["convert_checkpoint.py", f"--input={hf}", f"--output={project}",
          "--output_format=project"])
  assert checkpoints.resolve_checkpoint(str(project))[0] == "project"
  run_ok(["convert_checkpoint.py", f"--input={project}", f"--output={back}",
          "--output_format=tf1"])

  converted = _model_tensors(str(back / "bert_model.ckpt"))
  assert sorted(converted) == sorted(original)
  for name, value in original.items():
    assert converted[name].dtype == value.dtype and converted[name].shape == value.shape, name
    np.testing.assert_array_equal(converted[name], value, err_msg=name)
  # The config comes back as the original wrote it (the tanh GELU named "gelu" again) and the
  # vocab is copied byte for byte at every step.
  with open(os.path.join(TINY, "bert_config.json"), encoding="utf-8") as f:
    want = modeling.BertConfig.from_dict(json.load(f))
  assert modeling.BertConfig.from_json_file(str(back / "bert_config.json")) == want
  with open(hf / "config.json", encoding="utf-8") as f:
    assert json.load(f)["hidden_act"] == "gelu_new"  # HF's name for the tanh form.
  vocab = open(os.path.join(TINY, "vocab.txt"), "rb").read()
  for directory in (hf, project, back):
    assert (directory / "vocab.txt").read_bytes() == vocab


@requires_shared
def test_hf_keys_and_transposes(tmp_path):
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  convert_checkpoint.convert(os.path.join(TINY, "bert_model.ckpt"), str(tmp_path), "hf")
  tensors = load_file(str(tmp_path / "model.safetensors"))
  original = _model_tensors(os.path.join(TINY, "bert_model.ckpt"))
  np.testing.assert_array_equal(
      tensors["bert.encoder.layer.1.attention.self.query.weight"],
      original["bert/encoder/layer_1/attention/self/query/kernel"].T)
  np.testing.assert_array_equal(tensors["cls.predictions.bias"],
                                original["cls/predictions/output_bias"])


@requires_shared
def test_encoder_only_input_converts_without_heads(tmp_path):
  encoder = checkpoints.EncoderHolder(modeling.BertConfig.from_json_file(
      os.path.join(TINY, "bert_config.json")))
  checkpoints.init_from_checkpoint(encoder, os.path.join(TINY, "bert_model.ckpt"))
  checkpoints.export_hf_checkpoint(encoder, str(tmp_path / "hf"),
                                   vocab_file=os.path.join(TINY, "vocab.txt"))
  prefix = convert_checkpoint.convert(str(tmp_path / "hf"), str(tmp_path / "tf1" / "m.ckpt"),
                                      "tf1",
                                      bert_config_file=os.path.join(TINY, "bert_config.json"))
  names = set(_model_tensors(prefix))
  assert names == {checkpoints.variable_name(v) for v in encoder.variables}
  assert not any(n.startswith("cls/") for n in names)


def test_bad_inputs(tmp_path):
  with pytest.raises(fileio.InputError, match="checkpoint not found"):
    convert_checkpoint.convert(str(tmp_path / "nothing.ckpt"), str(tmp_path / "out"), "hf")
  with pytest.raises(fileio.InputError, match="output_format"):
    convert_checkpoint.convert(str(tmp_path), str(tmp_path / "out"), "onnx")
  result = run_script(["convert_checkpoint.py", "--output_format=hf"], timeout=300)
  assert result.returncode == 2 and "--input and --output are required" in result.stderr


@requires_shared
def test_an_output_over_the_input_is_refused_before_any_work(tmp_path):
  copy = tmp_path / "ckpt"
  copy.mkdir()
  for name in os.listdir(TINY):
    (copy / name).write_bytes(open(os.path.join(TINY, name), "rb").read())
  before = {name: (copy / name).read_bytes() for name in os.listdir(copy)}
  prefix = str(copy / "bert_model.ckpt")
  cases = [(str(copy), "tf1", "bert_model.ckpt.index"), (prefix, "tf1", "bert_model.ckpt.index"),
           (str(copy), "hf", "vocab.txt")]
  for output, output_format, named in cases:
    with pytest.raises(fileio.InputError, match=f"{named} is the input given by --input="):
      convert_checkpoint.convert(prefix, output, output_format)
  # With the config and vocab from elsewhere, the same directory as HF output holds no input.
  assert convert_checkpoint.output_files(str(copy), "hf", with_vocab=False) == [
      str(copy / "model.safetensors"), str(copy / "config.json")]
  assert {name: (copy / name).read_bytes() for name in os.listdir(copy)} == before
  # A project output never hides a training run's checkpoints behind a new state file.
  training = tmp_path / "training"
  training.mkdir()
  (training / "ckpt-7.index").write_bytes(b"x")
  with pytest.raises(fileio.InputError, match="holds other checkpoints"):
    convert_checkpoint.convert(prefix, str(training), "project")
  assert os.listdir(training) == ["ckpt-7.index"]
