"""BERT fine-tuning for multiple choice on SWAG (Situations With Adversarial Generations).

The checkout's entry point of bert_tf2/run_swag.py, where the script is: `python run_swag.py --help`
lists its flags. Installed (`pip install .`) the same runs as `bert-run-swag`, and anywhere as
`python -m bert_tf2 run_swag`.
"""

from bert_tf2 import commands

if __name__ == "__main__":
  commands.run_script("run_swag")
