"""Errors in what a user asked for (options, checkpoints, files), and how fairseq's commands show them.

fairseq's console scripts catch nothing: an error raised while a model is built or a checkpoint
loaded reaches the user as a traceback, and fairseq's trainer re-raises a failed checkpoint load
as its own "Cannot load model parameters ...; please ensure that the architectures match", so the
plugin's explanation would sit in the middle of two tracebacks. In ``fairseq-*`` commands, an
uncaught exception that a ``UsageError`` caused (anywhere in its chain) prints that error's message
as one line instead; ``FAIRSEQ_SPARSE_TRACEBACK=1`` shows the traceback. Every other exception
keeps Python's report.
"""

import os
import sys
from typing import Optional


class UsageError(ValueError):
    """Something the user asked for that the plugin cannot do: the message says what and how to fix it."""


class CheckpointMismatchError(UsageError, RuntimeError):
    """A checkpoint whose parameters do not fit the model built from its (or the command line's) options."""


def usage_error_in_chain(err: Optional[BaseException]) -> Optional[UsageError]:
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UsageError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def report_usage_errors_in_one_line() -> None:
    """Install the one-line report in a ``fairseq-*`` console script (no other program's hook is touched)."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not program.startswith("fairseq-") or getattr(sys.excepthook, "reports_usage_errors", False):
        return
    previous = sys.excepthook

    def hook(kind, value, traceback):
        usage = usage_error_in_chain(value)
        if usage is None or os.environ.get("FAIRSEQ_SPARSE_TRACEBACK"):
            return previous(kind, value, traceback)
        print(f"{program}: error: {usage}", file=sys.stderr)

    hook.reports_usage_errors = True
    sys.excepthook = hook
