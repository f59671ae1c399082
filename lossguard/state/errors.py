"""Why the state cannot be used, for the operator (each a LossguardError the CLI and the daemon
report in one line), and the SQLite result codes that tell a damaged file from a busy one."""

from __future__ import annotations

from ..errors import LossguardError


class StateLocked(LossguardError):
    """Another lossguard daemon holds this state directory."""


class StateError(LossguardError):
    """The state directory or file cannot be used as it is (not a folder, not writable, not a
    database): the operator has to fix it, so the daemon refuses to start rather than fail every pass."""


class StateBusy(StateError):
    """Another writer held the state's write lock longer than this connection waits (an outside
    `sqlite3` shell in a transaction, a stuck disk): the write was not made."""


class StateTooNew(LossguardError):
    """The state file was written by a newer lossguard, whose layout this one does not know."""


DAMAGED = {11, 26}
"""SQLite's primary result codes for a file that is not (or no longer) a sound database: CORRUPT and
NOTADB. Such a file is moved aside and the state starts fresh; any other error (read-only, cannot
open, I/O) is the operator's to fix and must not cost the state."""


BUSY = {5, 6}
"""SQLite's BUSY and LOCKED: another connection holds the lock this one waited for."""
