"""Creates BERT pre-training examples (masked LM + next sentence prediction) as TFRecord files.

The checkout's entry point of bert_tf2/create_pretraining_data.py, where the script is: `python
create_pretraining_data.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-create-pretraining-data`, and anywhere as `python -m bert_tf2 create_pretraining_data`.
Imported (`import create_pretraining_data`), it holds the original's library functions instead
(bert_tf2/original_api/create_pretraining_data.py), and parses no flag.
"""

if __name__ == "__main__":
  from bert_tf2 import commands  # pylint: disable=g-import-not-at-top
  commands.run_script("create_pretraining_data")
else:
  # Not when run: the script then starts through run_script alone (TensorFlow loading under its
  # Ctrl-C handling, the script's flags).
  # pylint: disable-next=wildcard-import,unused-wildcard-import
  from bert_tf2.original_api.create_pretraining_data import *
