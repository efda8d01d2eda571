"""BERT fine-tuning for sentence and sentence-pair classification (GLUE, XNLI, your own TSV/CSV).

The checkout's entry point of bert_tf2/run_classifier.py, where the script is: `python
run_classifier.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-run-classifier`, and anywhere as `python -m bert_tf2 run_classifier`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("run_classifier")
