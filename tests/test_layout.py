"""The layout, the import rule and the flag rules, checked on the source, by a static tool (jedi,
the engine behind many editors' go-to-definition) and by running the scripts:

- the project's modules live in the package folder bert_tf2/ and are imported as `bert_tf2.X`,
  never as a bare `X` (one process holding both `modeling` and `bert_tf2.modeling` would have two
  copies of each module: two classes of each name, absl flags defined twice) and never
  relatively; only the checkout's top-level entry points and the design card's three library
  names (modeling.py, optimization.py, tokenization.py, which re-export bert_tf2's) sit beside it;
- no script imports another script, and importing one defines no flag: each script defines its
  flags, with its own defaults, in the define_flags() its cli() calls, and --help lists them;
- every project import, in the package, the entry points, tests/ and benchmarks/, resolves
  statically to the file it names.

The installed wheel's side is checked in test_quickstart.py's wheel test (a fresh venv).
"""

import ast
import glob
import json
import os
import re
import sys

import pytest

from conftest import ENV, ROOT, run_process

PACKAGE = os.path.join(ROOT, "bert_tf2")
MODULES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(PACKAGE, "*.py")))
# The one subpackage: the original's Python API, a module per original module (its names are
# then the original's: original_api.modeling, original_api.run_classifier, ...).
SUBMODULES = sorted("original_api." + os.path.basename(p)[:-3]
                    for p in glob.glob(os.path.join(PACKAGE, "original_api", "*.py")))
SCRIPTS = ("create_pretraining_data", "run_pretraining", "run_classifier", "run_squad", "run_ner",
           "run_swag", "evaluate_squad", "extract_features", "export_model", "build_vocab",
           "convert_checkpoint", "query_model", "quickstart")
DESIGN_CARD_LIBRARIES = ("modeling", "optimization", "tokenization")


def _sources():
  files = glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(PACKAGE, "*.py"))
  files += glob.glob(os.path.join(PACKAGE, "original_api", "*.py"))
  files += glob.glob(os.path.join(ROOT, "tests", "*.py"))
  files += glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))
  return sorted(files)


def _project_imports(tree):
  """(node, module) for each import of a bert_tf2 module; a module of the subpackage as
  "original_api.X"."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module in ("bert_tf2", "bert_tf2.original_api"):
      prefix = node.module[len("bert_tf2."):] + "." if "." in node.module else ""
      for alias in node.names:
        found.append((alias, prefix + alias.name))
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bert_tf2."):
      found.append((node, ".".join(node.module.split(".")[1:3])))
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("bert_tf2."):
          found.append((alias, ".".join(alias.name.split(".")[1:3])))
  return found


def test_the_layout():
  """The package holds every module; the top level holds only the entry points and the three
  design-card names, each a few lines that hand over to the package."""
  top = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "*.py")))
  assert top == sorted(SCRIPTS + DESIGN_CARD_LIBRARIES)
  assert set(top) <= set(MODULES)
  for name in top:
    with open(os.path.join(ROOT, f"{name}.py"), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    code = [node for node in tree.body if not (isinstance(node, ast.Expr)
                                               and isinstance(node.value, ast.Constant))]
    # A design-card module may first load TensorFlow quietly (original_api.quiet_start).
    if (name in DESIGN_CARD_LIBRARIES and code and isinstance(code[0], ast.ImportFrom)
        and code[0].module == "bert_tf2.original_api"
        and [a.name for a in code[0].names] == ["quiet_start"]):
      code = code[1:]
    assert len(code) <= 2, f"{name}.py is an entry point: it holds no code of its own"
  assert not os.path.exists(os.path.join(ROOT, "bert_tf2.py"))
  assert os.path.exists(os.path.join(PACKAGE, "__init__.py"))


def test_no_bare_or_relative_import_of_a_project_module():
  broken = []
  for path in _sources():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    here = os.path.relpath(path, ROOT)
    for node in ast.walk(tree):
      names = []
      if isinstance(node, ast.Import):
        names = [alias.name.split(".")[0] for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        if node.level:
          broken.append(f"{here}:{node.lineno}: relative import")
          continue
        names = [(node.module or "").split(".")[0]]
      # tests/ and benchmarks/ import their own helpers bare (conftest, common); a name of the
      # package's, never (benchmarks/tokenization.py is a benchmark, not the tokenizer). The
      # tests of the original's API import the checkout's root modules, as its users do (they
      # re-export the package: one copy of each module still).
      original_users = os.path.basename(path).startswith("test_original_")
      broken += [f"{here}:{node.lineno}: bare import of {name}" for name in names
                 if name in MODULES and not (
                     original_users and name in SCRIPTS + DESIGN_CARD_LIBRARIES)]
  assert not broken, "\n".join(broken)


def test_no_script_imports_another_script():
  broken = []
  for name in MODULES:
    with open(os.path.join(PACKAGE, f"{name}.py"), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node, module in _project_imports(tree):
      if module in SCRIPTS and module != name:
        broken.append(f"bert_tf2/{name}.py:{node.lineno} imports the script {module}")
  assert not broken, "\n".join(broken)


@pytest.mark.slow
def test_a_static_tool_resolves_every_project_import():
  """jedi, as an editor runs it on the checkout (its root is the project), resolves each project
  import to bert_tf2/X.py; under the old layout (a bert_tf2.py that set `__path__` at run time)
  it resolved none of them."""
  jedi = pytest.importorskip("jedi", reason="jedi is in requirements-test.txt")
  project = jedi.Project(ROOT)
  unresolved, checked = [], 0
  for path in _sources():
    with open(path, encoding="utf-8") as f:
      source = f.read()
    script = jedi.Script(source, path=path, project=project)
    lines = source.splitlines()
    seen = set()
    for node, module in _project_imports(ast.parse(source)):
      if module in seen:
        continue
      seen.add(module)
      line = lines[node.lineno - 1]
      last = module.split(".")[-1]
      column = line.index(last, node.col_offset if isinstance(node, ast.alias) else 0)
      names = script.goto(node.lineno, column, follow_imports=True)
      paths = {str(n.module_path) for n in names}
      checked += 1
      if paths != {os.path.join(PACKAGE, *module.split(".")) + ".py"}:
        unresolved.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {module} -> {paths}")
  assert checked > 200
  assert not unresolved, "\n".join(unresolved)


def _python(code):
  done = run_process([sys.executable, "-c", code], cwd=ROOT, env=ENV, timeout=300, check=False)
  assert done.returncode == 0, done.stderr
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_scripts_defines_no_flag():
  """A script's flags are defined by its define_flags(), which only its cli() calls: importing
  every script into one process (tests, notebooks, benchmarks) leaves absl's registry as it was."""
  # absl's app and logging and TensorFlow define flags of their own when imported: loaded first.
  added = _python(
      "import importlib, json\nimport tensorflow\nfrom absl import app, flags, logging\n"
      "before = set(flags.FLAGS)\n"
      f"for name in {list(SCRIPTS)!r}:\n  importlib.import_module('bert_tf2.' + name)\n"
      "print(json.dumps(sorted(set(flags.FLAGS) - before)))")
  assert added == []


@pytest.mark.parametrize("script,expected", [
    ("run_squad", {"max_seq_length": 384, "doc_stride": 128, "lr_schedule": "decay_after_warmup"}),
    ("run_classifier", {"max_seq_length": 128, "doc_stride": None,
                        "lr_schedule": "decay_after_warmup"}),
    ("run_pretraining", {"max_seq_length": 128, "lr_schedule": "original"}),
])
def test_each_script_defines_its_own_defaults(script, expected):
  """Per-script defaults are passed in when the flag is defined, never set on the shared registry
  afterwards; a second script's groups asking for another default fail loudly."""
  got = _python(
      f"import json\nfrom absl import flags\nfrom bert_tf2 import {script}, run_swag\n"
      f"{script}.define_flags()\n"
      f"values = {{name: flags.FLAGS[name].default for name in {sorted(expected)!r}}}\n"
      "try:\n  run_swag.define_flags()\n  values['clash'] = None\n"
      "except ValueError as e:\n  values['clash'] = str(e)\n"
      "print(json.dumps(values))")
  clash = got.pop("clash")
  assert got == expected
  if expected["max_seq_length"] != 128 or expected["lr_schedule"] != "decay_after_warmup":
    assert clash and "asked for with the default" in clash


@pytest.mark.parametrize("script", ["run_squad", "create_pretraining_data"])
def test_help_lists_every_flag_of_the_script(script):
  """`--help` lists every flag the script defines (its own and the shared groups), with its
  default, and none of absl's or TensorFlow's (absl's own --help listed only the flags of the
  __main__ module: none, through an entry point)."""
  expected = _python(
      f"import json\nfrom absl import flags\nfrom bert_tf2 import {script}\n"
      f"{script}.define_flags()\n"
      "print(json.dumps(sorted(f.name for m, fs in flags.FLAGS.flags_by_module_dict().items()"
      " if m.startswith('bert_tf2.') for f in fs)))")
  done = run_process([sys.executable, f"{script}.py", "--help"], cwd=ROOT, env=ENV, timeout=300,
                     check=False)
  assert done.returncode == 0, done.stderr
  listed = re.findall(r"^  --(\w+)=(.*?)(?:  \(|$)", done.stdout, re.M)
  assert sorted(name for name, _ in listed) == expected
  assert len(expected) > 15
  defaults = dict(listed)
  assert defaults["max_seq_length"] == ("384" if script == "run_squad" else "128")
  assert "--test_tmpdir" not in done.stdout and "--helpfull" in done.stdout


def _read_tree(path):
  with open(path, encoding="utf-8") as f:
    return ast.parse(f.read(), path)


def _names_flags(tree):
  """Whether the code (not its docstrings or comments) names absl's FLAGS."""
  return any(isinstance(node, ast.Name) and node.id == "FLAGS"
             or isinstance(node, ast.Attribute) and node.attr == "FLAGS"
             for node in ast.walk(tree))


def test_only_the_scripts_script_flags_and_commands_read_flags():
  """Library modules take plain values: a flag reaches them as an argument or a settings field
  (script_flags.settings), never by reading FLAGS on a script's behalf."""
  readers = {name for name in MODULES + SUBMODULES
             if _names_flags(_read_tree(os.path.join(PACKAGE, *name.split(".")) + ".py"))}
  assert readers - set(SCRIPTS) == {"script_flags", "commands"}
  assert "run_classifier" in readers  # the check sees FLAGS where it is read


def test_the_scripts_take_only_values_from_script_flags():
  """A fine-tuning or pre-training script asks script_flags for its flag groups, a settings
  record, the strategy and the compute dtype; everything else it gets from the library with
  those plain values (fine_tuning.build_trainer, not a flag-reading builder)."""
  allowed = re.compile(r"define_\w+|settings|strategy|compute_dtype")
  found = {}
  for name in [m for m in SCRIPTS if m.startswith("run_")]:
    tree = _read_tree(os.path.join(PACKAGE, f"{name}.py"))
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id == "script_flags"):
        found.setdefault(node.attr, set()).add(name)
  assert {attr for attr in found if not allowed.fullmatch(attr)} == set(), found
  assert {"settings", "strategy", "compute_dtype"} <= found.keys()


def _import_graph(paths, module_of):
  """{module: {modules it imports}} of the files `paths`, function-level imports included;
  `module_of(node)` gives the project modules an import node names."""
  graph = {}
  for path in paths:
    name = os.path.basename(path)[:-3]
    graph[name] = {m for node in ast.walk(_read_tree(path))
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   for m in module_of(node)} - {name}
  return graph


def _cycle(graph):
  """A list of modules that import each other in a ring, or None."""
  state = {}

  def visit(node, path):
    state[node] = "open"
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt, path + [nxt])
        if found:
          return found
    state[node] = "done"
    return None

  for start in sorted(graph):
    if start not in state:
      found = visit(start, [start])
      if found:
        return found
  return None


def test_no_import_cycle_in_the_package_or_the_benchmarks():
  """The package's modules form layers (function-level imports count: a lazy import is still a
  dependency), and so do the benchmarks' own modules (bare `import common`)."""
  package = _import_graph(glob.glob(os.path.join(PACKAGE, "*.py")),
                          lambda node: [module for _, module in _project_imports(
                              ast.Module(body=[node], type_ignores=[]))])
  assert len(package) > 25 and _cycle(package) is None, _cycle(package)
  paths = glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))
  own = {os.path.basename(p)[:-3] for p in paths}
  benchmarks = _import_graph(paths, lambda node: [
      alias.name for alias in node.names if alias.name in own]
      if isinstance(node, ast.Import) else [])
  assert _cycle(benchmarks) is None, _cycle(benchmarks)
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check sees one


def test_only_run_dir_joins_a_model_folder_file_name():
  """A model / output folder's file names are run_dir's constants, joined by its functions: no
  other module of the package joins one from a literal (issue #74: ~33 places in 11 files)."""
  from bert_tf2 import run_dir  # pylint: disable=g-import-not-at-top
  names = {run_dir.CONFIG_FILE, run_dir.VOCAB_FILE, run_dir.TASK_FILE, run_dir.THRESHOLDS_FILE,
           run_dir.STATE_FILE, run_dir.EVAL_RESULTS_FILE, run_dir.BEST_DIRECTORY,
           run_dir.BEST_STATE, run_dir.HF_CONFIG_FILE, run_dir.HF_WEIGHTS_FILE}
  joined = []
  for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
    if os.path.basename(path) == "run_dir.py":
      continue
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.path.join", "join")
          and any(isinstance(a, ast.Constant) and a.value in names for a in node.args)):
        joined.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {ast.unparse(node)}")
  assert not joined, "\n".join(joined)


def test_the_readme_is_a_front_door():
  """The README says what is true now, in at most 300 lines; dated runs live in the benchmarks'
  log (benchmarks/log/) and commit messages."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  assert len(lines) <= 300
  assert not [line for line in lines if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]


# --- processes: only conftest starts them, and the tests that do are marked `process` -----------

_PROCESS_CALLS = re.compile(r"system|popen|fork|forkpty|spawn\w*|exec\w*|posix_spawn\w*|"
                            r"create_subprocess_\w+|ProcessPoolExecutor")


def test_only_conftest_starts_processes():
  """A test starts a process through conftest's helpers only (run_script, run_ok, run_process,
  popen, ...): no other file of tests/ imports subprocess, multiprocessing or pty or calls os's
  process functions, so the static scan that marks `process` tests sees every one.
  tests/pretrain_worker.py and tests/script_server.py (conftest's warm start for scripts: it forks
  them) are programs the tests run, not test modules."""
  found = []
  for path in sorted(glob.glob(os.path.join(ROOT, "tests", "*.py"))):
    name = os.path.basename(path)
    if name in ("conftest.py", "pretrain_worker.py", "script_server.py"):
      continue
    for node in ast.walk(_read_tree(path)):
      modules = []
      if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        modules = [node.module or ""]
      found += [f"tests/{name}:{node.lineno}: imports {m}" for m in modules
                if m.split(".")[0] in ("subprocess", "multiprocessing", "pty")
                or m.startswith("concurrent.futures") and "ProcessPoolExecutor" in
                [alias.name for alias in node.names]]
      if (isinstance(node, ast.Attribute) and _PROCESS_CALLS.fullmatch(node.attr)
          and isinstance(node.value, ast.Name) and node.value.id in ("os", "asyncio", "futures")):
        found.append(f"tests/{name}:{node.lineno}: {node.value.id}.{node.attr}")
  assert not found, "\n".join(found)
  with open(os.path.join(ROOT, "tests", "conftest.py"), encoding="utf-8") as f:
    assert "import subprocess" in f.read()  # the check reads what it looks for


_SCAN_CONFTEST = '''
import subprocess
import pytest

def run_ok(args):
  return subprocess.run(args)

def concurrently(calls):
  return [call() for call in calls]

def train_twice(args):
  run_ok(args)
  return run_ok(args)

@pytest.fixture
def trained(tmp_path):
  return run_ok(["train.py", str(tmp_path)])

@pytest.fixture(name="plain")
def plain_fixture():
  return 1
'''

_SCAN_MODULE = '''
import functools
import pytest
import conftest
from conftest import concurrently, run_script as start, train_twice

def _score(x):
  return x

def _train(path):
  return start(["train.py", path])

def _deeper(path):
  return _train(path)

@pytest.fixture
def model(tmp_path):
  return _deeper(tmp_path)

@pytest.fixture
def exported(model):
  return model

@pytest.fixture
def data():
  return [1, 2]

def test_through_fixtures(exported):
  assert exported

def test_through_a_partial(tmp_path):
  concurrently([functools.partial(_train, tmp_path)])

def test_conftest_fixture(trained):
  assert trained

def test_module_attribute():
  conftest.run_ok(["x.py"])

def test_conftest_function():
  train_twice(["x.py"])

@pytest.mark.usefixtures("model")
def test_usefixtures():
  pass

STEPS = [train_twice]

def test_through_a_constant():
  STEPS[0](["x.py"])

@pytest.mark.parametrize("n", [1, 2])
def test_in_process(n, data, plain, tmp_path):
  assert _score(n) and concurrently([lambda: data])

class TestBase:
  def _helper(self):
    return _train("p")

  def test_method(self):
    self._helper()

  def test_pure(self):
    assert _score(1)

class TestChild(TestBase):
  pass
'''

_SCAN_OTHER = '''
import pytest
from test_synthetic import _deeper, _score

@pytest.fixture
def trained():
  return "cached"

def test_imported_function():
  _deeper("p")

def test_overridden_fixture(trained):
  assert _score(trained)
'''


def test_the_process_scan_follows_functions_fixtures_and_classes():
  """conftest.ProcessScan, which marks the `process` tests: a helper reached through fixtures
  (of the module, of conftest, by usefixtures), module functions (passed as a partial, kept in a
  list, imported from another test module), `module.helper`, renamed imports and methods (an
  inherited test too) counts; tests that reach none, or whose module overrides a process fixture
  of conftest's with its own, do not."""
  import conftest  # pylint: disable=g-import-not-at-top
  scan = conftest.ProcessScan({"conftest": _SCAN_CONFTEST, "test_synthetic": _SCAN_MODULE,
                               "test_other": _SCAN_OTHER})
  process = {"test_through_fixtures", "test_through_a_partial", "test_conftest_fixture",
             "test_module_attribute", "test_conftest_function", "test_usefixtures",
             "test_through_a_constant"}
  for name in process | {"test_in_process"}:
    assert scan.starts_process("test_synthetic", name) == (name in process), name
  for cls in ("TestBase", "TestChild"):
    assert scan.starts_process("test_synthetic", "test_method", cls)
    assert not scan.starts_process("test_synthetic", "test_pure", cls)
  assert scan.fixture_starts_process("test_synthetic", "exported")
  assert scan.fixture_starts_process("test_synthetic", "trained")  # conftest's
  assert not scan.fixture_starts_process("test_synthetic", "plain")
  assert scan.starts_process("test_other", "test_imported_function")
  assert not scan.starts_process("test_other", "test_overridden_fixture")
  assert not scan.fixture_starts_process("test_other", "trained")


def test_the_process_scan_on_the_real_tests(request):
  """On this checkout's tests: a module helper (_python), a module-scoped fixture (quickstart's
  `run`) and a popen through a helper function count; the in-process tests do not."""
  import conftest  # pylint: disable=g-import-not-at-top
  sources = {}
  for path in glob.glob(os.path.join(ROOT, "tests", "*.py")):
    with open(path, encoding="utf-8") as f:
      sources[os.path.basename(path)[:-3]] = f.read()
  scan = conftest.ProcessScan(sources)
  assert scan.starts_process("test_layout", "test_importing_the_scripts_defines_no_flag")
  assert scan.starts_process("test_layout", "test_help_lists_every_flag_of_the_script")
  assert scan.fixture_starts_process("test_quickstart", "run")
  assert scan.starts_process("test_quickstart", "test_loss_plot_and_tensorboard_logs")
  assert scan.starts_process("test_reliability_data",
                             "test_ctrl_c_while_the_script_starts_is_one_line")
  assert not scan.starts_process("test_quickstart", "test_docstring_sentences_leave_code_out")
  assert not scan.starts_process("test_layout", "test_the_layout")
  assert not scan.starts_process("test_layout", "test_the_guard_fails_a_test_the_scan_missed")
  assert request.node.get_closest_marker("process") is None


def test_the_guard_fails_a_test_the_scan_missed(monkeypatch):
  """With the guard on (as in `make test-fast`), a helper called by a test not marked `process`
  (here reached through getattr, which the scan cannot follow) fails the test before any process
  starts."""
  import conftest  # pylint: disable=g-import-not-at-top
  helper = getattr(conftest, "run_" + "script")
  monkeypatch.setitem(conftest._guard, "on", True)  # pylint: disable=protected-access
  with pytest.raises(pytest.fail.Exception, match="the static scan did not mark it: "
                                                  r"tests/test_layout.py::test_the_guard"):
    helper(["-c", "pass"])


def test_the_gpu_set_up_installs_tensorflows_cuda_build_with_the_same_pins(tmp_path):
  """`make setup-gpu`'s requirements: requirements.txt with tensorflow-cpu replaced by
  tensorflow[and-cuda] at the same version (pip cannot drop a line of an included file, and two
  lists of pins would drift apart)."""
  target = tmp_path / "requirements-gpu.txt"
  made = run_process(["make", "-s", f"GPU_REQUIREMENTS={target}", str(target)], cwd=ROOT,
                     env=ENV, timeout=60)
  assert made.returncode == 0, made.stderr
  with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
    cpu = [line.strip() for line in f if line.strip() and not line.startswith("#")]
  gpu = [line.strip() for line in target.read_text().splitlines()
         if line.strip() and not line.startswith("#")]
  version = next(line.split("==")[1] for line in cpu if line.startswith("tensorflow-cpu=="))
  assert sorted(gpu) == sorted([line for line in cpu if not line.startswith("tensorflow-cpu==")]
                               + [f"tensorflow[and-cuda]=={version}"])
