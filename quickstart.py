"""The whole system end to end, in a few minutes on a laptop CPU, with nothing to download.

The checkout's entry point of bert_tf2/quickstart.py, where the script is: `python quickstart.py
--help` lists its flags. Installed (`pip install .`) the same runs as `bert-quickstart`, and
anywhere as `python -m bert_tf2 quickstart`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("quickstart")
