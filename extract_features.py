"""Per-token hidden states of a pre-trained BERT, as JSON lines (the original's output format).

The checkout's entry point of bert_tf2/extract_features.py, where the script is: `python
extract_features.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-extract-features`, and anywhere as `python -m bert_tf2 extract_features`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("extract_features")
