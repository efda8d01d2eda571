"""The package `bert_tf2` in a checkout: `from bert_tf2 import modeling` finds ./modeling.py.

The project's modules stay flat at the top of the checkout, so that `python run_classifier.py`
(every script) runs from it as it always did. They import each other as `from bert_tf2 import X`
all the same, and both ways the project is used answer to that name:

- Installed (`pip install .`, see pyproject.toml), the checkout's root *is* the package: its .py
  files are copied into site-packages/bert_tf2/ (this one too, unused there), with ./__init__.py
  as the package's init, and nothing else of the project is put at the top of site-packages (no
  `training`, `metrics`, ...).
- In a checkout the root is not a directory named bert_tf2, so this module stands in for the
  package: a module with a `__path__` is a package, and `from bert_tf2 import X` (or `import
  bert_tf2.X`) then loads X.py from this file's directory. The checkout's root is on sys.path
  whenever a script there runs (it is the script's directory), and tests/ and benchmarks/ put it
  there.

Every module of the project imports its siblings only as `bert_tf2.X`, never as a bare `X`: one
process holding both `modeling` and `bert_tf2.modeling` would have two copies of each module (two
classes of each name, absl flags defined twice).
"""

import os

__path__ = [os.path.dirname(os.path.abspath(__file__))]
