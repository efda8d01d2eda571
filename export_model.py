"""Exports SavedModels for serving and TF Hub: encoder, text preprocessor, classifier, SQuAD.

The checkout's entry point of bert_tf2/export_model.py, where the script is: `python export_model.py
--help` lists its flags. Installed (`pip install .`) the same runs as `bert-export-model`, and
anywhere as `python -m bert_tf2 export_model`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("export_model")
