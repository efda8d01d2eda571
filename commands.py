"""The console commands `pip install .` puts on the PATH, one per script (see pyproject.toml).

Each runs the script exactly as `python SCRIPT.py` does: it imports the script (whose flags are
defined at import, or by its define_flags()) and hands its main to fileio.run_main. One command
runs per process, so the scripts' flags never meet.
"""

import importlib

from absl import flags

from bert_tf2 import fileio


def _run(module_name, define=False, required=(), positional=False):
  fileio.stop_quietly_while_starting()  # Ctrl-C while the script's imports load: one line
  module = importlib.import_module("bert_tf2." + module_name)
  if define:
    module.define_flags()
  for name in required:
    flags.mark_flag_as_required(name)
  fileio.run_main(module.main, positional=positional)


def create_pretraining_data():
  _run("create_pretraining_data", define=True,
       required=("input_file", "output_file", "vocab_file"))


def run_pretraining():
  _run("run_pretraining")


def run_classifier():
  _run("run_classifier")


def run_squad():
  _run("run_squad")


def run_ner():
  _run("run_ner")


def run_swag():
  _run("run_swag")


def evaluate_squad():
  _run("evaluate_squad", define=True, positional=True)


def extract_features():
  _run("extract_features")


def export_model():
  _run("export_model", define=True)


def build_vocab():
  _run("build_vocab", define=True)


def convert_checkpoint():
  _run("convert_checkpoint", define=True)


def quickstart():
  from bert_tf2 import quickstart as module  # pylint: disable=g-import-not-at-top
  raise SystemExit(module.main())
