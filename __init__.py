"""bert_tf2: BERT on TensorFlow 2, installed as a package (`pip install .`).

`from bert_tf2 import modeling, tokenization, training`; each script also has a console command
(`bert-run-classifier`, ...). In a checkout, ./bert_tf2.py plays this package's part, and the
scripts run as `python run_classifier.py`.
"""
