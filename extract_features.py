"""Per-token hidden states of a pre-trained BERT, as JSON lines (the original's output format).

The checkout's entry point of bert_tf2/extract_features.py, where the script is: `python
extract_features.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-extract-features`, and anywhere as `python -m bert_tf2 extract_features`. Imported (`import
extract_features`), it holds the original's library functions instead
(bert_tf2/original_api/extract_features.py), and parses no flag.
"""

if __name__ == "__main__":
  from bert_tf2 import commands  # pylint: disable=g-import-not-at-top
  commands.run_script("extract_features")
else:
  # Not when run: the script then starts through run_script alone (TensorFlow loading under its
  # Ctrl-C handling, the script's flags).
  # pylint: disable-next=wildcard-import,unused-wildcard-import
  from bert_tf2.original_api.extract_features import *
