"""The console commands `pip install .` puts on the PATH, one per script (see pyproject.toml).

Each runs the script's `cli()`, exactly what `python SCRIPT.py` runs (its flags, the required
ones, its main through fileio.run_main). One command runs per process, so the scripts' flags
never meet.
"""

import importlib

from bert_tf2 import fileio


def _run(module_name):
  fileio.stop_quietly_while_starting()  # Ctrl-C while the script's imports load: one line
  importlib.import_module("bert_tf2." + module_name).cli()


def create_pretraining_data():
  _run("create_pretraining_data")


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
  _run("evaluate_squad")


def extract_features():
  _run("extract_features")


def export_model():
  _run("export_model")


def build_vocab():
  _run("build_vocab")


def convert_checkpoint():
  _run("convert_checkpoint")


def quickstart():
  _run("quickstart")
