"""The exception tree. Library errors are translated into these at the module that owns the library,
so callers (the CLI, the daemon) handle one family and never see a raw traceback for bad input.
A log that cannot be read, or not in its format, is no error: readers return it as a Problem."""

from __future__ import annotations


class LossguardError(Exception):
    """Base of every error lossguard raises on purpose."""


class ConfigError(LossguardError):
    """A configuration, alias or rules file is invalid; the message names the file and the field."""


class UsageError(LossguardError):
    """The command line asked for something impossible (a path that does not exist...)."""


class OutputError(LossguardError):
    """The output cannot be written where the user sent it (a full disk, a closed stdout, a file
    that refuses writes); the message names where."""
