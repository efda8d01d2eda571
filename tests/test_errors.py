"""errors: the ground floor (it imports nothing of the project), its one-line messages for
missing and repeated flags, and the old names fileio and training keep for it."""

import ast
import os

import pytest

from bert_tf2 import errors
from bert_tf2 import fileio
from bert_tf2 import training


def test_required_flags_are_named_in_one_line():
  errors.require(a="x", b=1)
  with pytest.raises(errors.InputError, match=r"^--vocab_file is required$"):
    errors.require(output_dir="out", vocab_file="")
  with pytest.raises(errors.InputError, match=r"^--a, --b and --c are required$"):
    errors.require(a=None, b="", c=0, d="kept")


def test_a_list_flag_with_an_empty_or_repeated_entry_is_named():
  assert errors.check_distinct(["a", "b"], "labels") == ["a", "b"]
  assert errors.check_distinct(None, "labels") is None
  with pytest.raises(errors.InputError, match=r"^--labels=a,,b has an empty label$"):
    errors.check_distinct(["a", "", "b"], "labels", "label")
  with pytest.raises(errors.InputError, match=r"^--labels: 'a' is given twice$"):
    errors.check_distinct(["a", "b", "a"], "labels")


def test_the_kinds_and_the_old_names():
  assert issubclass(errors.InputError, errors.ReportedError)
  assert issubclass(errors.InputError, ValueError)
  assert issubclass(errors.TrainingError, errors.ReportedError)
  assert issubclass(errors.TrainingError, RuntimeError)
  assert not issubclass(errors.TrainingError, errors.InputError)
  assert fileio.InputError is errors.InputError and fileio.ReportedError is errors.ReportedError
  assert fileio.require is errors.require and fileio.check_distinct is errors.check_distinct
  assert training.TrainingError is errors.TrainingError


def test_errors_imports_nothing_of_the_project():
  with open(errors.__file__, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  imported = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
  assert not imported, [ast.dump(node) for node in imported]
  assert os.path.basename(errors.__file__) == "errors.py"
