"""Learns a vocabulary from a corpus: a WordPiece vocab.txt or a SentencePiece model.

The checkout's entry point of bert_tf2/build_vocab.py, where the script is: `python build_vocab.py
--help` lists its flags. Installed (`pip install .`) the same runs as `bert-build-vocab`, and
anywhere as `python -m bert_tf2 build_vocab`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("build_vocab")
