"""Runs an exported SavedModel on inputs given as flags and prints its outputs as JSON.

The checkout's entry point of bert_tf2/query_model.py, where the script is: `python query_model.py
--help` lists its flags. Installed (`pip install .`) the same runs as `bert-query-model`, and
anywhere as `python -m bert_tf2 query_model`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("query_model")
