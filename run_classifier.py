"""BERT fine-tuning for sentence and sentence-pair classification (GLUE, XNLI, your own TSV/CSV).

The checkout's entry point of bert_tf2/run_classifier.py, where the script is: `python
run_classifier.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-run-classifier`, and anywhere as `python -m bert_tf2 run_classifier`. Imported (`import
run_classifier`), it holds the original's library functions instead
(bert_tf2/original_api/run_classifier.py), and parses no flag.
"""

if __name__ == "__main__":
  from bert_tf2 import commands  # pylint: disable=g-import-not-at-top
  commands.run_script("run_classifier")
else:
  # Not when run: the script then starts through run_script alone (TensorFlow loading under its
  # Ctrl-C handling, the script's flags).
  # pylint: disable-next=wildcard-import,unused-wildcard-import
  from bert_tf2.original_api.run_classifier import *
