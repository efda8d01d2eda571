"""BERT fine-tuning for extractive question answering on SQuAD 1.1 and 2.0.

The checkout's entry point of bert_tf2/run_squad.py, where the script is: `python run_squad.py
--help` lists its flags. Installed (`pip install .`) the same runs as `bert-run-squad`, and anywhere
as `python -m bert_tf2 run_squad`. Imported (`import run_squad`), it holds the original's library
functions instead (bert_tf2/original_api/run_squad.py), and parses no flag.
"""

if __name__ == "__main__":
  from bert_tf2 import commands  # pylint: disable=g-import-not-at-top
  commands.run_script("run_squad")
else:
  # Not when run: the script then starts through run_script alone (TensorFlow loading under its
  # Ctrl-C handling, the script's flags).
  # pylint: disable-next=wildcard-import,unused-wildcard-import
  from bert_tf2.original_api.run_squad import *
