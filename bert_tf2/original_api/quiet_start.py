"""Imported for its effect: TensorFlow loaded as the scripts load it, quietly
(processes.import_tensorflow_quietly), before the fronts import the package. Code written against
the original's API (`import modeling` in a user's own script) then shows no start-up notices and
no XLA service lines, which its users read as something wrong with their code (issue #73)."""

from bert_tf2 import processes

processes.import_tensorflow_quietly()
