"""BERT fine-tuning for extractive question answering on SQuAD 1.1 and 2.0.

The checkout's entry point of bert_tf2/run_squad.py, where the script is: `python run_squad.py
--help` lists its flags. Installed (`pip install .`) the same runs as `bert-run-squad`, and anywhere
as `python -m bert_tf2 run_squad`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("run_squad")
