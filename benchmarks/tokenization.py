"""WordPiece batch tokenization of real text, M tokens/s: ours against HuggingFace `tokenizers`.

Text: the WikiText-2 validation sentences and the SQuAD v1.1 dev contexts from ../shared/data,
tokenized with the standard uncased 30,522-token vocabulary (lower-cased). Measured, in one
process, each corpus in one call:

- ours, `FullTokenizer.encode_batch`: cold (a fresh tokenizer and empty module caches for each
  timed call, the first pass over new text) and warm (the same text again, every word cached);
- the reference path, `FullTokenizer.tokenize` + `convert_tokens_to_ids` one text at a time: the
  original's algorithm, the issue's "original Python" figure;
- the peer, `tokenizers.BertWordPieceTokenizer(vocab, lowercase=True)`, `encode_batch` and (when
  the installed version has it) `encode_batch_fast`, without special tokens; it runs on every core.

Every HF id list is compared with ours; `mismatches` counts the texts whose ids differ (HF cuts
words at 100 characters, the original at 200, for one). Tokens are counted from our output.
Issue #6 target: ours >= 2x HF tokenizers, with identical ids.

  python benchmarks/tokenization.py
  python benchmarks/tokenization.py --max_texts=200 --repeats=1      # smoke test
"""

import json
import os

from absl import app
from absl import flags

import common

FLAGS = flags.FLAGS

flags.DEFINE_list("corpora", ["wikitext", "squad"], "wikitext | squad.")
flags.DEFINE_integer("max_texts", 0, "Use only the first N texts of each corpus (0 = all).")
flags.DEFINE_string("vocab_file",
                    os.path.join(common.SHARED, "reference", "pretraining", "vocab_uncased.txt"),
                    "WordPiece vocabulary.")
flags.DEFINE_bool("reference", True, "Also time the one-text-at-a-time reference path.")

_CORPORA = {
    "wikitext": os.path.join(common.SHARED, "data", "corpus",
                             "wikitext2_valid.sent_per_line.txt"),
    "squad": os.path.join(common.SHARED, "data", "squad", "dev-v1.1.json"),
}


def load_texts(name):
  """The non-empty lines of the WikiText file, or the distinct SQuAD contexts in file order."""
  path = _CORPORA[name]
  if name == "wikitext":
    with open(path, encoding="utf-8") as f:
      texts = [line.strip() for line in f if line.strip()]
  else:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)["data"]
    texts = list(dict.fromkeys(p["context"] for article in data for p in article["paragraphs"]))
  return texts[:FLAGS.max_texts] if FLAGS.max_texts else texts


def _fresh_tokenizer():
  from bert_tf2 import tokenization  # pylint: disable=g-import-not-at-top
  # The Unicode cleaning table is filled on demand and kept by the module; a cold pass pays for
  # it as a new process would.
  tokenization._CLEAN_TABLE.clear()  # pylint: disable=protected-access
  return tokenization.FullTokenizer(FLAGS.vocab_file, do_lower_case=True)


def measure_ours(texts):
  """{variant: {seconds, ...}} and our ids."""
  cold_ids = []

  def cold(tokenizer):
    cold_ids[:] = tokenizer.encode_batch(texts)

  results = {"encode_batch_cold": common.timed(cold, warmup=0, setup=_fresh_tokenizer)}
  warm_tokenizer = _fresh_tokenizer()
  results["encode_batch_warm"] = common.timed(lambda: warm_tokenizer.encode_batch(texts),
                                              warmup=1)
  if FLAGS.reference:
    reference = _fresh_tokenizer()

    def one_by_one():
      return [reference.convert_tokens_to_ids(reference.tokenize(t)) for t in texts]

    reference_ids = one_by_one()
    results["reference_one_by_one"] = common.timed(one_by_one, warmup=0, repeats=1)
    results["reference_one_by_one"]["ids_equal_batch"] = reference_ids == cold_ids
  return results, cold_ids


def measure_peer(texts):
  """{method: timing} of HF's batch encoders, and their ids."""
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  wrapper = BertWordPieceTokenizer(FLAGS.vocab_file, lowercase=True)
  methods = {"encode_batch": wrapper.encode_batch}
  # Newer versions also have a batch encoder that skips the character offsets; the peer's best
  # counts. It lives on the Rust tokenizer the wrapper holds.
  rust = getattr(wrapper, "_tokenizer", None)
  if hasattr(rust, "encode_batch_fast"):
    methods["encode_batch_fast"] = rust.encode_batch_fast
  results, ids = {}, None
  for method, encode in methods.items():
    encodings = []

    def run(encode=encode, encodings=encodings):
      encodings[:] = encode(texts, add_special_tokens=False)

    results[method] = common.timed(run, warmup=1)
    if ids is None:
      ids = [e.ids for e in encodings]
  return results, ids


def compare(ours, theirs, texts, limit=3):
  """Number of texts whose ids differ, and the first few differences."""
  examples, count = [], 0
  for i, (a, b) in enumerate(zip(ours, theirs)):
    if a != b:
      count += 1
      if len(examples) < limit:
        at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        examples.append({"text": i, "position": at, "ours": a[at:at + 5], "peer": b[at:at + 5],
                         "text_start": texts[i][:80]})
  return count, examples


def main(argv):
  del argv
  missing = common.peer_missing_note(["tokenizers"])
  run_peer = FLAGS.peer and not missing
  ours, peer, corpora = {}, {}, {}
  for name in FLAGS.corpora:
    texts = load_texts(name)
    our_results, our_ids = measure_ours(texts)
    tokens = sum(map(len, our_ids))
    corpora[name] = {"texts": len(texts), "characters": sum(map(len, texts)), "tokens": tokens,
                     "ours": our_results}
    if run_peer:
      peer_results, peer_ids = measure_peer(texts)
      mismatches, examples = compare(our_ids, peer_ids, texts)
      corpora[name].update(peer=peer_results, mismatches=mismatches,
                           mismatch_examples=examples)
    for side, results in (("ours", our_results), ("peer", corpora[name].get("peer", {}))):
      for variant, timing in results.items():
        total = (ours if side == "ours" else peer).setdefault(variant, {"tokens": 0, "s": 0.0})
        total["tokens"] += tokens
        total["s"] += timing["median_s"]
  for totals in (ours, peer):
    for r in totals.values():
      r["per_s"] = r["tokens"] / r["s"] / 1e6

  def only(results, *names):
    return {k: v for k, v in results.items() if k in names}

  figures = [
      common.figure("batch tokenization, cold", "M tokens/s", only(ours, "encode_batch_cold"),
                    peer, "per_s", target_ratio=2.0),
      common.figure("batch tokenization, warm", "M tokens/s", only(ours, "encode_batch_warm"),
                    peer, "per_s", target_ratio=2.0),
      common.figure("reference path (original algorithm) vs HF", "M tokens/s",
                    only(ours, "reference_one_by_one"), peer, "per_s"),
  ]
  mismatches = {n: c.get("mismatches") for n, c in corpora.items()}
  figures[0]["mismatches"] = mismatches
  common.emit(
      "tokenization", figures,
      settings={"corpora": {n: _CORPORA[n] for n in FLAGS.corpora},
                "max_texts": FLAGS.max_texts, "vocab_file": FLAGS.vocab_file,
                "do_lower_case": True, "repeats": FLAGS.repeats,
                "figure": "tokens of all corpora / sum of median seconds",
                "rayon_num_threads": os.environ.get("RAYON_NUM_THREADS")},
      details={"ours": ours, "peer": peer, "corpora": corpora},
      peer_name="HF tokenizers BertWordPieceTokenizer (Rust)", peer_missing=missing)


if __name__ == "__main__":
  app.run(main)
