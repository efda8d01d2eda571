"""The original google-research/bert's Python API as thin fronts over the project's code: one
module per original module, each re-exported by the checkout's root module of the same name
(`import modeling`, `import run_classifier`, ...). docs/coming-from-the-original.md has the table
of every public name of the original's modules: kept, kept with a TF2 meaning, or gone.

The root's modeling and optimization import quiet_start first, which loads TensorFlow as the
scripts do, quietly. Not this package itself: the root's scripts, imported, give their fronts
from here, and create_pretraining_data's worker processes (which import the main module) must
not load TensorFlow.
"""
