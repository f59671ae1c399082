"""Roots whose history is owed a first reading: an object store that could not be listed whole at
a fresh daemon's first start. Its copy held nothing (or part) of what the store held then, so what
its first complete listing brings is the store's past, to be read quietly as a first start reads a
folder, not news. Until then its files are not followed at all (a partial copy read quietly would
leave the rest of its history to be alerted). The debt is kept in the state (state.owed), written
in the pass that incurs or pays it, so it holds through a kill -9 at any point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..state import State, Transaction


@dataclass
class OwedHistory:
    state: State
    roots: Sequence[Path]
    answered: Callable[[Path], bool]
    """Whether a root was read whole in this process (watch.mirrors.Mirrors.answered)."""
    log: Callable[[str], None]
    _owed: set[str] | None = field(default=None, init=False)

    def due(self, *, first: bool) -> tuple[list[str], list[str]]:
        """The roots owed and still unread (held: not followed this pass), and those read whole now
        (paying: what a walk finds under them is history). `first`: a fresh state's first pass,
        where a root not read whole joins the debt."""
        if self._owed is None:
            self._owed = self.state.history_owed()
        owed = set(self._owed) | ({str(r) for r in self.roots if not self.answered(r)} if first else set())
        held = sorted(r for r in owed if not self.answered(Path(r)))
        return held, sorted(owed - set(held))

    def record(self, tx: Transaction, *, first: bool, held: Sequence[str], paid: Sequence[str]) -> None:
        """In the pass's transaction: the debt a first pass incurs, and what a walk paid."""
        if first and held:
            tx.owe_history(held)
        if paid:
            tx.history_read(paid)

    def committed(self, *, held: Sequence[str], paid: Sequence[str]) -> None:
        if self._owed is not None:
            self._owed = (self._owed | set(held)) - set(paid)
        for root in paid:
            self.log(f"{root}: listed whole for the first time since the first start: what it holds was read as history, not alerted")
