"""tools/gpu_session.sh, the lent GPU machine's session scripted ahead: a bundle packed into
carry folders that fit one device call each, staged part by part, installed, and the one-line
errors, on a small bundle in ../shared/gpu's format (the real one is 775 MiB). A mistake here
would only show on a GPU session, whose minutes are few. Also the benchmarks' TensorFlow
environment (common.tensorflow_env), which keeps the bundle's variables away from torch."""

import hashlib
import io
import json
import os
import random
import shutil
import tarfile
import zipfile

import pytest

from conftest import PYTHON, ROOT, SHARED, run_process
import test_trim_fatbins

INSTALLER = os.path.join(SHARED, "gpu", "install_bundle.sh")
SCRIPT = os.path.join(ROOT, "tools", "gpu_session.sh")
pytestmark = [
    pytest.mark.skipif(not os.path.isfile(INSTALLER),
                       reason="../shared/gpu/install_bundle.sh (the bundle's installer) is absent"),
    pytest.mark.skipif(not (shutil.which("zstd") and shutil.which("git")),
                       reason="needs the zstd and git commands"),
]


def _files():
  """The tree of a small bundle: an incompressible 'library' (no ELF file: pack leaves it as it
  is) and a TensorFlow stand-in."""
  rng = random.Random(0)
  return {"nvidia/cublas/lib/libcublas.so.12": rng.randbytes(3 << 20),
          "tensorflow/__init__.py": b"__version__ = 'bundle-test'\n",
          "fakepkg_stub/README": b"not a wheel\n"}


def _cuda_library(tmp_path):
  """A real shared library with sm_80 and sm_90 device code (test_trim_fatbins' builder), and
  what pack must leave of it: the sm_90 entry alone."""
  rng = random.Random(1)
  sass80 = test_trim_fatbins.entry(test_trim_fatbins.ELF, 80, rng.randbytes(1 << 16))
  sass90 = test_trim_fatbins.entry(test_trim_fatbins.ELF, 90, rng.randbytes(1 << 15))
  blob = test_trim_fatbins.fatbin([sass80, sass90])
  library = test_trim_fatbins.build_library(tmp_path / "libcuda_kernels.so", [blob])
  return library.read_bytes(), blob, test_trim_fatbins.fatbin([sass90])


def _bundle(path, more=None):
  """A bundle as ../shared/gpu/make_bundle.sh writes one: parts of a zstd tar, a MANIFEST."""
  files = {**_files(), **(more or {})}
  listing = "".join(f"{hashlib.sha256(data).hexdigest()}  ./{name}\n"
                    for name, data in sorted(files.items()))
  files[".bundle/TREE.sha256"] = listing.encode()
  raw = io.BytesIO()
  with tarfile.open(fileobj=raw, mode="w") as tar:
    for name, data in sorted(files.items()):
      info = tarfile.TarInfo("./" + name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  archive = run_process(["zstd", "-q", "-3", "--long=27", "-c"], input=raw.getvalue(),
                        check=True, cwd=None, env=None, timeout=None, text=False).stdout
  path.mkdir()
  cut = 1 << 20
  parts = [archive[i:i + cut] for i in range(0, len(archive), cut)]
  lines = ["# test bundle", "name tensorflow-test-gpu", "python 3.12", "cudnn trim",
           "compression zstd", f"tree_files {len(files) - 1}", "tree_bytes 0",
           f"archive_bytes {len(archive)}",
           f"archive_sha256 {hashlib.sha256(archive).hexdigest()}", f"parts {len(parts)}"]
  for i, part in enumerate(parts):
    (path / f"part-{i:03d}").write_bytes(part)
    lines.append(f"part part-{i:03d} {len(part)} {hashlib.sha256(part).hexdigest()}")
  (path / "MANIFEST").write_text("\n".join(lines) + "\n")
  shutil.copy(INSTALLER, path / "install_bundle.sh")
  return files


def _wheel(path):
  """A minimal pure-Python wheel (what pack carries beside the parts)."""
  name = "fakepkg-0.1-py3-none-any.whl"
  contents = {"fakepkg/__init__.py": "VALUE = 42\n",
              "fakepkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: fakepkg\n"
                                                "Version: 0.1\n",
              "fakepkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                             "Root-Is-Purelib: true\nTag: py3-none-any\n"}
  contents["fakepkg-0.1.dist-info/RECORD"] = "".join(f"{n},,\n" for n in contents) + \
      "fakepkg-0.1.dist-info/RECORD,,\n"
  with zipfile.ZipFile(path / name, "w") as z:
    for arcname, text in contents.items():
      z.writestr(arcname, text)
  return path / name


def _checkout(path):
  """A git checkout holding the script, with .gpu ignored as in the project."""
  (path / "tools").mkdir(parents=True)
  shutil.copy(SCRIPT, path / "tools" / "gpu_session.sh")
  shutil.copy(os.path.join(ROOT, "tools", "trim_fatbins.py"), path / "tools")
  (path / ".gitignore").write_text("/.gpu/\n/gpu_results/\n")
  (path / "README").write_bytes(b"x" * 100_000)  # a working tree that travels with every call
  run_process(["git", "init", "-q", str(path)], check=True, cwd=None, env=None, timeout=None,
              text=False, capture_output=False)
  return path


def _run(checkout, *args, **env):
  return run_process(["bash", "tools/gpu_session.sh", *args], cwd=checkout,
                     env={**os.environ, "PYTHON": PYTHON, **env}, timeout=300, check=False)


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc to build a CUDA-like library")
def test_pack_stage_install_round_trip_and_each_call_fits(tmp_path):
  library, fat, fat90 = _cuda_library(tmp_path)
  files = _bundle(tmp_path / "bundle", {"nvidia/kernels/lib/libkernels.so": library})
  wheel = _wheel(tmp_path)
  checkout = _checkout(tmp_path / "checkout")
  env = {"CALL_MIB": "1", "PACK_LEVEL": "3", "PACK_RESERVE_KIB": "64",
         "STAGE": str(tmp_path / "stage"), "TF_ROOT": str(tmp_path / "tf")}

  # What the GPU tests read of ../shared rides in the last folder.
  pretraining = tmp_path / "shared" / "reference" / "pretraining"
  pretraining.mkdir(parents=True)
  (pretraining / "vocab_uncased.txt").write_text("[PAD]\n")
  # The bundle named relative to where pack is started (the script moves to the checkout).
  packed = _run(checkout, "pack", "../bundle", str(wheel), **env)
  assert packed.returncode == 0, packed.stderr
  folders = sorted((checkout / ".gpu").iterdir())
  assert len(folders) >= 4  # 3 MiB of random bytes in calls of 1 MiB
  assert [f.name for f in folders] == [f"p{i:02d}" for i in range(len(folders))]
  listed = run_process(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                       cwd=checkout, env=None, timeout=None, check=True).stdout
  tree = sum((checkout / name).stat().st_size for name in listed.split())
  assert tree > 100_000  # README and the script: what travels with every call
  for folder in folders:
    size = sum(f.stat().st_size for f in folder.iterdir())
    # One call: a folder beside the working tree, with PACK_RESERVE_KIB to spare.
    assert size + tree <= (1 << 20) - 64 * 1024, (folder, size)
    assert {"MANIFEST", "install_bundle.sh"} <= {f.name for f in folder.iterdir()}
  assert (folders[-1] / wheel.name).exists()
  with tarfile.open(folders[-1] / "shared.tar.gz") as tar:
    assert tar.extractfile("reference/pretraining/vocab_uncased.txt").read() == b"[PAD]\n"
  assert packed.stdout.count("run(carry=") == len(folders)
  assert "stage .gpu/p00" in packed.stdout and "finish 570" in packed.stdout
  status = run_process(["git", "status", "--porcelain", "--untracked-files=all"],
                       cwd=checkout, env=None, timeout=None, check=True).stdout
  assert ".gpu" not in status  # the carry folders never travel with the tree
  assert "every carry folder fits" in _run(checkout, "fits", **env).stdout
  (checkout / "grown.txt").write_bytes(b"y" * 80_000)  # a commit after pack, over the reserve
  grown = _run(checkout, "fits", **env)
  assert grown.returncode == 1
  assert grown.stderr.strip() == ("error: the working tree grew since pack: make it smaller, or "
                                  "pack again")
  (checkout / "grown.txt").unlink()

  for i, folder in enumerate(folders):
    staged = _run(checkout, "stage", f".gpu/{folder.name}", **env)
    assert staged.returncode == 0, staged.stderr
    assert f"{i + 1} of {len(folders)} parts present and intact" in staged.stdout

  installed = _run(checkout, "install", **env)
  assert installed.returncode == 0, installed.stderr
  for name, data in files.items():
    if not name.startswith(".bundle") and not name.endswith("libkernels.so"):
      assert (tmp_path / "tf" / name).read_bytes() == data, name
  # The CUDA library keeps its sm_90 code only (the sm_80 entry's bytes are zeros), same size.
  trimmed = (tmp_path / "tf" / "nvidia" / "kernels" / "lib" / "libkernels.so").read_bytes()
  at = library.index(fat)
  assert len(trimmed) == len(library) and trimmed[:at] == library[:at]
  assert trimmed[at:at + len(fat)] == fat90 + bytes(len(fat) - len(fat90))
  assert trimmed[at + len(fat):] == library[at + len(fat):]
  assert "cuda_arch sm_90" in (folders[0] / "MANIFEST").read_text().splitlines()
  env_sh = (tmp_path / "tf" / ".bundle" / "env.sh").read_text()
  assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in env_sh and "PYTHONPATH=" in env_sh
  assert (tmp_path / "tf" / "fakepkg" / "__init__.py").read_text() == "VALUE = 42\n"
  again = _run(checkout, "install", **env)  # a second install keeps the tree
  assert again.returncode == 0 and "already unpacked" in again.stdout, again.stderr


def test_one_line_errors(tmp_path):
  _bundle(tmp_path / "bundle")
  checkout = _checkout(tmp_path / "checkout")
  env = {"PACK_LEVEL": "3", "STAGE": str(tmp_path / "stage"), "TF_ROOT": str(tmp_path / "tf")}

  def error(*args, **more):
    result = _run(checkout, *args, **{**env, **more})
    assert result.returncode != 0
    return result.stderr.strip().splitlines()[-1]

  assert error("pack", str(tmp_path / "none")).endswith("no MANIFEST and install_bundle.sh "
                                                         "(make it with ../shared/gpu/make_bundle.sh)")
  assert "not a .whl file" in error("pack", str(tmp_path / "bundle"), str(tmp_path))
  assert error("pack", str(tmp_path / "bundle"), CALL_MIB="0") == \
      "error: the working tree leaves no room for a part in 0 MiB"
  assert error("stage", ".gpu/p07") == "error: .gpu/p07: not carried into this call"
  assert error("fits") == "error: no carry folders in .gpu: run pack first"
  assert "no parts staged" in error("install")
  for command in ("check", "test", "bench"):
    assert error(command) == (f"error: TensorFlow is not installed in {tmp_path / 'tf'}: "
                              "run install first")
  (checkout / ".gpu" / "p00").mkdir(parents=True, exist_ok=True)
  (checkout / ".gpu" / "p00" / "part-000").write_bytes(b"earlier")
  assert "is not empty" in error("pack", str(tmp_path / "bundle"))
  (checkout / ".gitignore").write_text("")
  assert "not ignored by git" in error("pack", str(tmp_path / "bundle"))
  assert _run(checkout, "frobnicate").returncode == 2  # usage
  assert error("finish", "soon") == ("error: finish takes the seconds the call may run, "
                                     "e.g. finish 540")


def test_finish_brings_back_one_archive_even_when_a_step_fails(tmp_path):
  """The last call's results come back as one archive ($OUT returns 8 files at most), with the
  log naming the step that failed and the steps not run after it."""
  checkout = _checkout(tmp_path / "checkout")
  out = tmp_path / "out"
  result = _run(checkout, "finish", "200", OUT=str(out), STAGE=str(tmp_path / "stage"),
                TF_ROOT=str(tmp_path / "tf"))
  assert result.returncode == 0, result.stderr
  assert sorted(p.name for p in out.iterdir()) == ["results.tar.gz"]
  with tarfile.open(out / "results.tar.gz") as tar:
    log = tar.extractfile("./finish.txt").read().decode()
  assert "== install (120 s at most" in log
  assert "error: no parts staged" in log and "== check" not in log and "== done" in log


def test_tensorflow_env_reaches_tensorflow_children_only(tmp_path):
  """The model benchmarks' children on our side get $BENCH_TF_ENV's variables (the bundle's
  PYTHONPATH and CUDA 12 libraries); the peer's run without them; a broken file is one error."""
  env_sh = tmp_path / "env.sh"
  env_sh.write_text("export PYTHONPATH=/bundle/tf${PYTHONPATH:+:$PYTHONPATH}\n"
                    "export XLA_FLAGS='--a=1 --b=2'\n")
  code = ("import json, sys; sys.path.insert(0, 'benchmarks'); import common; "
          "print(json.dumps(common.tensorflow_env(dict(json.loads(sys.argv[1])))))")

  def tf_env(base):
    result = run_process([PYTHON, "-c", code, json.dumps(base)], cwd=ROOT, env=None,
                         timeout=120, check=False)
    return result

  base = {"PATH": os.environ["PATH"], "PYTHONPATH": "/mine"}
  plain = tf_env(base)
  assert plain.returncode == 0, plain.stderr
  assert json.loads(plain.stdout) == base  # no BENCH_TF_ENV: untouched
  added = json.loads(tf_env({**base, "BENCH_TF_ENV": str(env_sh)}).stdout)
  assert added["PYTHONPATH"] == "/bundle/tf:/mine" and added["XLA_FLAGS"] == "--a=1 --b=2"
  assert added["PATH"] == base["PATH"]
  env_sh.write_text("exit 3\n")
  broken = tf_env({**base, "BENCH_TF_ENV": str(env_sh)})
  assert broken.returncode != 0
  assert broken.stderr.strip().splitlines()[-1].startswith(f"error: BENCH_TF_ENV={env_sh}")
