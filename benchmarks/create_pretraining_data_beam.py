"""create_pretraining_data as an Apache Beam job on Beam's local runner, against the local fast
mode and the original, and its peak memory per worker on a corpus and on 10x that corpus.

The text is made as create_pretraining_data_speed.py makes it (copies of the WikiText-2 validation
corpus in ../shared, later copies with shuffled documents and rotated sentences). Three runs on
the same text with the original's flags (seq 128, 20 predictions, masked_lm_prob 0.15, dupe 10),
each a process of its own, wall time with start-up included:
  beam:     --mode=fast --beam_pipeline_options="--runner=FnApiRunner --direct_num_workers=2
            --direct_running_mode=multi_processing" (Beam's in-process runner, two worker
            processes; no download, no network);
  fast:     --mode=fast --num_workers=2, the local run the Beam job must match record for record
            (the number of records of both is compared);
  original: the original google-research/bert script (../shared/reference/original/
            run_original.py, TF 2 through its TF1 compatibility API; needs `six`), the peer.
Then the Beam job again on the corpus (1x) and on --scale times as much text, with smaller chunks
so that both span many: the peak RSS of each Beam worker process (VmHWM, read from /proc every
0.1 s) must not grow with the corpus. The runner process itself (the local runner, which holds
every collection between steps: here chunk descriptions and piece names) is reported apart.
Prints one JSON line (common.emit).

  python benchmarks/create_pretraining_data_beam.py
  python benchmarks/create_pretraining_data_beam.py --target_mb=0.05 --dupe_factor=1 \
      --scale=2 --nooriginal   # smoke
"""

import os
import shutil
import sys
import tempfile

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS

flags.DEFINE_float("target_mb", 4.3, "Size of the text of the speed runs, in MB (10^6 bytes).")
flags.DEFINE_integer("scale", 10, "The memory runs' large text is this many times the corpus.")
flags.DEFINE_bool("original", True, "Also run the original script (the peer) on the same text.")
flags.DEFINE_integer("dupe_factor", 10, "--dupe_factor.")
flags.DEFINE_integer("workers", 2, "Beam worker processes (--direct_num_workers) and the local "
                     "fast mode's --num_workers.")
flags.DEFINE_integer("memory_chunk_documents", 6, "--chunk_documents of the memory runs.")
common.define_corpus_flags()

SCRIPT = os.path.join(common.ROOT, "create_pretraining_data.py")


class PeakRss:
  """The peak resident set (VmHWM) of every process under a run, as last seen, by process id,
  and whether the process is a Beam worker (an SDK harness) or not (the runner, a shell)."""

  def __init__(self):
    self.peaks = {}

  def __call__(self, root):
    for pid in common.process_tree(root):
      try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
          # The Python process, not the shell that starts it.
          worker = b"-m\0apache_beam.runners.worker.sdk_worker_main" in f.read()
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
          peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
      except (OSError, StopIteration, ValueError):
        continue
      self.peaks[pid] = (worker, max(peak, self.peaks.get(pid, (worker, 0))[1]))

  def summary(self):
    workers = [peak for worker, peak in self.peaks.values() if worker]
    others = [peak for worker, peak in self.peaks.values() if not worker]
    return {"worker_processes": len(workers),
            "worker_peak_gb": round(max(workers) / 1e9, 3) if workers else None,
            "runner_peak_gb": round(max(others) / 1e9, 3) if others else None}


def run(name, args, output, input_mb):
  """Runs one command writing `output` (a directory or a file); its measurements."""
  print(f"[create_pretraining_data_beam] {name} on {input_mb:.2f} MB ...", file=sys.stderr,
        flush=True)
  peaks = PeakRss()
  result = common.run_measured(args, on_sample=peaks)
  result.update(peaks.summary())
  if result["exit_code"] == 0:
    paths = ([os.path.join(output, p) for p in sorted(os.listdir(output))]
             if os.path.isdir(output) else [output])
    result["per_s"] = input_mb / result["wall_s"]
    result["records"] = sum(common.count_records(path) for path in paths)
    result["peak_memory_gb"] = max(result["max_process_rss_gb"], result["tree_pss_gb"])
  if os.path.isdir(output):
    shutil.rmtree(output)
  elif os.path.exists(output):
    os.remove(output)
  return result


def main(argv):
  del argv
  work_dir = tempfile.mkdtemp(prefix="cpd_beam_")
  beam_missing = common.missing(["apache_beam"])
  note = (f"apache_beam is not importable by {sys.executable}; `pip install -r "
          f"requirements-beam.txt`") if beam_missing else None
  try:
    documents = common.read_documents(FLAGS.corpus)
    text = os.path.join(work_dir, "corpus.txt")
    input_mb = common.build_text(documents, int(FLAGS.target_mb * 1e6), text) / 1e6
    flags_of_run = [f"--vocab_file={FLAGS.vocab_file}", "--do_lower_case=True",
                    "--max_seq_length=128", "--max_predictions_per_seq=20",
                    "--masked_lm_prob=0.15", "--random_seed=12345",
                    f"--dupe_factor={FLAGS.dupe_factor}"]
    beam_options = (f"--beam_pipeline_options=--runner=FnApiRunner "
                    f"--direct_num_workers={FLAGS.workers} "
                    f"--direct_running_mode=multi_processing")
    ours = [sys.executable, SCRIPT, "--mode=fast", f"--input_file={text}", *flags_of_run]
    runs = {"fast": ours + [f"--num_workers={FLAGS.workers}"]}
    if not beam_missing:
      runs["beam"] = ours + [beam_options]
    if FLAGS.original:
      runs["original"] = [sys.executable, common.RUN_ORIGINAL, "create_pretraining_data",
                          f"--input_file={text}", *flags_of_run]
    results = {}
    for name, args in runs.items():
      output = os.path.join(work_dir, name + ("/" if name != "original" else ".tfrecord"))
      results[name] = run(name, args + [f"--output_file={output}"], output.rstrip("/"),
                          input_mb)

    memory = {}
    if not beam_missing:
      corpus_mb = os.path.getsize(FLAGS.corpus) / 1e6
      large = os.path.join(work_dir, f"corpus_x{FLAGS.scale}.txt")
      large_mb = common.build_text(documents, int(FLAGS.scale * corpus_mb * 1e6), large) / 1e6
      for name, path, mb in (("x1", FLAGS.corpus, corpus_mb),
                             (f"x{FLAGS.scale}", large, large_mb)):
        output = os.path.join(work_dir, f"memory_{name}")
        memory[name] = run(f"beam memory {name}", [
            sys.executable, SCRIPT, "--mode=fast", f"--input_file={path}", *flags_of_run,
            f"--chunk_documents={FLAGS.memory_chunk_documents}", "--num_output_shards=4",
            beam_options, f"--output_file={output}/"], output, mb)
        memory[name]["input_mb"] = round(mb, 3)
  finally:
    shutil.rmtree(work_dir, ignore_errors=True)

  original = {"original": results["original"]} if "original" in results else None
  beam = {"beam": results["beam"]} if "beam" in results else {}
  figures = [
      common.figure(f"create_pretraining_data as a Beam job (local runner, {FLAGS.workers} "
                    f"worker processes) vs the original", "MB/s of text", beam, original,
                    "per_s"),
      common.figure(f"local fast mode ({FLAGS.workers} workers) vs the original", "MB/s of text",
                    {"fast": results["fast"]}, original, "per_s"),
      common.figure("Beam job vs local fast mode", "MB/s of text", beam,
                    {"fast": results["fast"]}, "per_s"),
  ]
  if memory:
    large = f"x{FLAGS.scale}"
    figures.append(common.figure(
        f"Beam worker peak RSS, {FLAGS.scale}x the corpus (ours) vs 1x (peer); ratio 1x / "
        f"{FLAGS.scale}x, 1 = flat", "GB", {large: memory[large]}, {"x1": memory["x1"]},
        "worker_peak_gb", higher_is_better=False))
  same_records = (results.get("beam", {}).get("records") == results["fast"].get("records")
                  if beam else None)
  common.emit(
      "create_pretraining_data_beam", figures,
      settings={"input_mb": round(input_mb, 3), "corpus": FLAGS.corpus,
                "dupe_factor": FLAGS.dupe_factor, "max_seq_length": 128,
                "max_predictions_per_seq": 20, "workers": FLAGS.workers, "scale": FLAGS.scale,
                "memory_chunk_documents": FLAGS.memory_chunk_documents,
                "beam_pipeline_options": beam_options.split("=", 1)[1]},
      details={"runs": results, "memory": memory, "beam_and_fast_same_record_count": same_records,
               "measures": "per_s: MB of text / wall s (start-up included); worker_peak_gb: "
                           "largest VmHWM among Beam worker processes; runner_peak_gb: largest "
                           "among the other processes (the local runner); tree_pss_gb: peak "
                           "summed PSS of the process tree"},
      peer_name="the original google-research/bert create_pretraining_data.py (run_original.py, "
                "same text and flags, same run)",
      peer_missing=note or (None if original else "--nooriginal"))


if __name__ == "__main__":
  app.run(main)
