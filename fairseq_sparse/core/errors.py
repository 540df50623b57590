"""Errors in what a user asked for (options, checkpoints, files), and how fairseq's commands show them.

fairseq's console scripts catch nothing: an error raised while a model is built or a checkpoint
loaded reaches the user as a traceback, and fairseq's trainer re-raises a failed checkpoint load
as its own "Cannot load model parameters ...; please ensure that the architectures match", so the
plugin's explanation would sit in the middle of two tracebacks. In ``fairseq-*`` commands and this
package's own (``python -m fairseq_sparse.NAME``), an uncaught exception that a ``UsageError``
caused (anywhere in its chain) prints that error's message as one line instead;
``FAIRSEQ_SPARSE_TRACEBACK=1`` shows the traceback. Every other exception keeps Python's report.
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


def command_name() -> Optional[str]:
    """The running command if it is one of fairseq's console scripts or of this package
    (``python -m fairseq_sparse.evaluate``: ``evaluate``), else None."""
    path = sys.argv[0] if sys.argv and sys.argv[0] else ""
    name = os.path.basename(path)
    if name.startswith("fairseq-"):
        return name
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if path.endswith(".py") and os.path.abspath(path).startswith(package + os.sep):
        stem = os.path.splitext(name)[0]
        return os.path.basename(os.path.dirname(path)) if stem == "__main__" else stem
    return None


def report_usage_errors_in_one_line() -> None:
    """Install the one-line report. The command is looked at when an exception arrives (``python -m``
    names its module in ``sys.argv`` only after importing the package): any other program's
    exceptions go to the hook that was there before."""
    if getattr(sys.excepthook, "reports_usage_errors", False):
        return
    previous = sys.excepthook

    def hook(kind, value, traceback):
        usage, program = usage_error_in_chain(value), command_name()
        if usage is None or program is None or os.environ.get("FAIRSEQ_SPARSE_TRACEBACK"):
            return previous(kind, value, traceback)
        print(f"{program}: error: {usage}", file=sys.stderr)

    hook.reports_usage_errors = True
    sys.excepthook = hook


def refuse_folder_as_user_dir(init_file: str) -> None:
    """Stop a command that was given one of this package's folders as ``--user-dir`` instead of the package
    (fairseq imports a user dir by its folder's own name, so the folder's ``__init__`` sees a name without
    the package's): one line naming both folders, where fairseq would go on without the plugin and end in
    "invalid choice" for the architecture or an UnpicklingError for a checkpoint."""
    folder = os.path.dirname(os.path.abspath(init_file))
    plugin = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    raise SystemExit(f"{command_name() or 'fairseq-sparse'}: error: --user-dir {folder} is a folder of fairseq-sparse, "
                     f"not the plugin: pass --user-dir {plugin} (python -m fairseq_sparse --user-dir prints it)")
