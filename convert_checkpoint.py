"""Converts BERT checkpoints among Google TF1, HuggingFace safetensors and this project's format.

The checkout's entry point of bert_tf2/convert_checkpoint.py, where the script is: `python
convert_checkpoint.py --help` lists its flags. Installed (`pip install .`) the same runs as
`bert-convert-checkpoint`, and anywhere as `python -m bert_tf2 convert_checkpoint`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("convert_checkpoint")
