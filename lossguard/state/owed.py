"""The roots whose history the daemon still owes a first reading: an object store that could not
be listed whole at the first start. Its copy was empty then, so what its first complete listing
brings is the store's past, to be read quietly as the history found at a first start is, not news.
Kept as `meta` rows (`history-owed:<root>`), written in the pass that owes or reads it, so a kill -9
between the two finds the debt still recorded."""

from __future__ import annotations

from .transaction import OWED, Connected


class OwedHistory(Connected):
    """State's read of the roots whose history is still owed (a pass writes them through Transaction)."""

    def history_owed(self) -> set[str]:
        rows = self.db.execute("SELECT key FROM meta WHERE substr(key, 1, ?) = ?", (len(OWED), OWED)).fetchall()
        return {key[len(OWED):] for (key,) in rows}
