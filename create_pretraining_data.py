"""Creates BERT pre-training examples (masked LM + next sentence prediction) as TFRecord files.

The checkout's entry point of bert_tf2/create_pretraining_data.py, where the script is: `python
create_pretraining_data.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-create-pretraining-data`, and anywhere as `python -m bert_tf2 create_pretraining_data`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("create_pretraining_data")
