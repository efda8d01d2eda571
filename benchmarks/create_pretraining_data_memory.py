"""Peak memory of create_pretraining_data's fast mode on a corpus and on a 10x larger copy of it.

Fast mode promises memory bounded by its chunk size, worker count and shuffle buffer, never by the
corpus size (the original needs about 210 bytes of RAM per byte of text). This runs the script in
a subprocess on ../shared/data/corpus/wikitext2_valid.sent_per_line.txt and on that text repeated
--scale times (in a temporary directory), samples the summed resident memory of the script and
its worker processes from /proc (PSS, so pages shared between processes count once), and prints
one JSON line: both peaks and their ratio (the target is <= 1.5). Small chunks make even the small input span several chunks, so both runs are in the
steady state the bound is about.

  python benchmarks/create_pretraining_data_memory.py [--scale=10] [--num_workers=2]
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
CORPUS = os.path.join(SHARED, "data", "corpus", "wikitext2_valid.sent_per_line.txt")
VOCAB = os.path.join(SHARED, "reference", "pretraining", "vocab_uncased.txt")


def _children(pid):
  """Child processes of `pid`, from each process's parent id in /proc/*/stat (the kernel's
  /proc/PID/task/PID/children list is not available on every kernel)."""
  children = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        # The parent id is the second field after the parenthesised command name.
        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
          children.append(int(entry))
    except (OSError, IndexError, ValueError):
      continue
  return children


def _pss_bytes(pid):
  """Proportional set size: resident memory with shared pages split among their sharers.

  Plain RSS would count a freshly spawned worker (a fork of the parent until it execs) as a
  second copy of the parent's memory.
  """
  try:
    with open(f"/proc/{pid}/smaps_rollup") as f:
      for line in f:
        if line.startswith("Pss:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def _tree_memory(pid):
  """Memory (PSS) of a process and all its descendants, in bytes."""
  total, stack = 0, [pid]
  while stack:
    current = stack.pop()
    total += _pss_bytes(current)
    stack.extend(_children(current))
  return total


def run_and_measure(args, interval=0.05):
  """Runs `args`; returns (peak memory of the process tree, wall seconds, stderr)."""
  start = time.monotonic()
  process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  peak = [0]

  def sample():
    while process.poll() is None:
      peak[0] = max(peak[0], _tree_memory(process.pid))
      time.sleep(interval)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  _, stderr = process.communicate()
  sampler.join()
  if process.returncode != 0:
    raise RuntimeError(f"{' '.join(args)} failed:\n{stderr[-3000:]}")
  return peak[0], time.monotonic() - start, stderr


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scale", type=int, default=10)
  parser.add_argument("--num_workers", type=int, default=2)
  parser.add_argument("--dupe_factor", type=int, default=2)
  parser.add_argument("--chunk_documents", type=int, default=6)
  parser.add_argument("--shuffle_buffer_size", type=int, default=2000)
  options = parser.parse_args()
  if not os.path.isfile(CORPUS):
    sys.exit(f"missing {CORPUS}: this benchmark needs ../shared beside the project")

  work = tempfile.mkdtemp(prefix="cpd_memory_")
  try:
    large = os.path.join(work, f"corpus_x{options.scale}.txt")
    with open(CORPUS, "rb") as source:
      text = source.read()
    with open(large, "wb") as f:
      for _ in range(options.scale):
        f.write(text.rstrip(b"\n") + b"\n\n")
    results = {}
    for name, path in (("x1", CORPUS), (f"x{options.scale}", large)):
      out = os.path.join(work, f"out_{name}") + "/"
      peak, seconds, _ = run_and_measure([
          sys.executable, os.path.join(ROOT, "create_pretraining_data.py"), "--mode=fast",
          f"--input_file={path}", f"--output_file={out}", f"--vocab_file={VOCAB}",
          f"--num_workers={options.num_workers}", f"--dupe_factor={options.dupe_factor}",
          f"--chunk_documents={options.chunk_documents}",
          f"--shuffle_buffer_size={options.shuffle_buffer_size}", "--num_output_shards=2"])
      results[name] = {"input_bytes": os.path.getsize(path), "peak_pss_bytes": peak,
                       "seconds": round(seconds, 2)}
      shutil.rmtree(out)
    small, big = results["x1"]["peak_pss_bytes"], results[f"x{options.scale}"]["peak_pss_bytes"]
    print(json.dumps({
        "benchmark": "create_pretraining_data_memory", "mode": "fast",
        "num_workers": options.num_workers, "dupe_factor": options.dupe_factor,
        "chunk_documents": options.chunk_documents, **results,
        "peak_memory_ratio": round(big / small, 3), "target_ratio": 1.5,
        # ru_maxrss of the children: the largest single process (KiB on Linux), for reference.
        "max_single_process_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                                        * 1024,
    }))
  finally:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
