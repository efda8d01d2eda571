"""BERT fine-tuning for named-entity recognition on CoNLL-2003 style files.

The checkout's entry point of bert_tf2/run_ner.py, where the script is: `python run_ner.py --help`
lists its flags. Installed (`pip install .`) the same runs as `bert-run-ner`, and anywhere as
`python -m bert_tf2 run_ner`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("run_ner")
