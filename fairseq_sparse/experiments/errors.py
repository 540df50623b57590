"""The ways a table run fails: its configuration, its record of finished cells, or one of its commands."""

from ..core.errors import UsageError


class ConfigError(UsageError):
    """A table configuration that cannot be run; the message names the file and the entry."""


class RecordError(UsageError):
    """A record file (``--record``) that cannot be read as written: a duplicate or unparsable cell, a merge's
    conflict markers. It is never rewritten: the message names the file and the line to mend."""


class StepError(Exception):
    """A command of the pipeline failed; the message holds the tail of its log."""
