"""The two ways a table run fails: its configuration, or one of its commands."""

from ..core.errors import UsageError


class ConfigError(UsageError):
    """A table configuration that cannot be run; the message names the file and the entry."""


class StepError(Exception):
    """A command of the pipeline failed; the message holds the tail of its log."""
