"""bert_tf2: BERT on TensorFlow 2.

`from bert_tf2 import modeling, tokenization, training`. The scripts (bert_tf2/run_classifier.py,
...) start as `python run_classifier.py` in a checkout (the top-level entry points), as
`bert-run-classifier` after `pip install .`, and as `python -m bert_tf2 run_classifier` anywhere.
"""
