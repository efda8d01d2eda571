"""`python -m bert_tf2 SCRIPT [--flag=value ...]`: any script, in a checkout or installed."""

from bert_tf2 import commands

commands.main()
