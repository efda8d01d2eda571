"""SQuAD v1.1 and v2.0 evaluation with the official scripts' rules and output.

The checkout's entry point of bert_tf2/evaluate_squad.py, where the script is: `python
evaluate_squad.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-evaluate-squad`, and anywhere as `python -m bert_tf2 evaluate_squad`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("evaluate_squad")
