"""Imported for its effect, by the root's modeling.py and optimization.py before anything else:
TensorFlow loaded as the scripts load it, quietly (processes.import_tensorflow_quietly). Code written against
the original's API (`import modeling` in a user's own script) then shows no start-up notices and
no XLA service lines, which its users read as something wrong with their code (issue #73)."""

from bert_tf2 import processes

processes.import_tensorflow_quietly()
