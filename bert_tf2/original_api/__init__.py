"""The original google-research/bert's Python API as thin fronts over the project's code: one
module per original module, each re-exported by the checkout's root module of the same name
(`import modeling`, `import run_classifier`, ...). docs/coming-from-the-original.md has the table
of every public name of the original's modules: kept, kept with a TF2 meaning, or gone.

Importing it loads TensorFlow as the scripts do, quietly (quiet_start); the root's modeling,
optimization and tokenization import quiet_start first, before the package's modules.
"""

from bert_tf2.original_api import quiet_start  # pylint: disable=unused-import
