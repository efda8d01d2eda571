"""The errors a user is shown as one `error: ...` line, and the checks of required and list flags
that raise them: the ground floor every other module stands on (it imports nothing of the
project). commands.run_main, every script's entry point, prints a `ReportedError` as that line
with exit status 2 for an `InputError` (the command or its inputs need fixing) and 1 for the
others (the run itself could not go on, e.g. `TrainingError`)."""


class ReportedError(Exception):
  """An error `run_main` reports as one `error: ...` line, without a traceback."""


class InputError(ReportedError, ValueError):
  """A problem with the user's input (file, line, record or flag), reported without a traceback."""


class TrainingError(ReportedError, RuntimeError):
  """Training cannot go on (e.g. losses stay non-finite); the last good checkpoint is kept."""


def require(**values):
  """InputError naming every flag (keyword, in order) of `values` that has no value, all in one
  line: how every script requires a flag, whether always or only in some runs."""
  missing = [f"--{name}" for name, value in values.items() if not value]
  if len(missing) == 1:
    raise InputError(f"{missing[0]} is required")
  if missing:
    raise InputError(f"{', '.join(missing[:-1])} and {missing[-1]} are required")


def check_distinct(values, flag, what="value"):
  """InputError naming --`flag` when a list flag (e.g. --labels) has an empty or repeated entry."""
  for i, value in enumerate(values or ()):
    if not value:
      raise InputError(f"--{flag}={','.join(values)} has an empty {what}")
    if value in values[:i]:
      raise InputError(f"--{flag}: {value!r} is given twice")
  return values
