"""Pre-trains BERT (masked LM + next-sentence prediction) on create_pretraining_data.py's records.

The checkout's entry point of bert_tf2/run_pretraining.py, where the script is: `python
run_pretraining.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-run-pretraining`, and anywhere as `python -m bert_tf2 run_pretraining`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("run_pretraining")
