"""The pictures of announced incidents (state layout 7): the curves as they were when the alert was
raised, kept per sink that shows them, drawn and sent once the alert went out there, then marked
done (or given up) and their curves dropped."""

from __future__ import annotations

from .rows import PlotRow
from .transaction import Connected


class Plots(Connected):
    """State's reads and writes of the `plots` table (a pass adds pictures through Transaction)."""

    def due_plots(self, limit: int) -> list[PlotRow]:
        """Pictures not yet shown whose incident's alert (opened or escalated, or the report of it
        when a silence held it back) went out to their sink."""
        rows = self.db.execute(
            "SELECT p.incident_id, p.sink, p.picture, p.attempts, i.thread, o.id FROM plots p "
            "JOIN incidents i ON i.id = p.incident_id "
            "JOIN outbox o ON o.id = (SELECT min(id) FROM outbox WHERE incident_id = p.incident_id AND sink = p.sink "
            "AND kind IN ('opened', 'escalated', 'unsilenced') AND sent_at IS NOT NULL AND silenced IS NULL) "
            "WHERE p.done_at IS NULL ORDER BY p.incident_id, p.sink LIMIT ?", (limit,),
        ).fetchall()
        return [PlotRow(r[0], r[1], r[2], r[3], r[4], f"{self.id}-{r[5]}") for r in rows]

    def plot_done(self, incident_id: int, sink: str | None, *, now: float, error: str | None = None) -> None:
        """Shown (or, with `error`, given up): never tried again; the curves are dropped (the PNG
        stays under the state directory). `sink` None: for every sink (the picture cannot be drawn)."""
        with self.transaction():
            query = "UPDATE plots SET done_at=?, error=?, picture='', attempts=attempts+1 WHERE incident_id=? AND done_at IS NULL"
            if sink is None:
                self.db.execute(query, (now, error, incident_id))
            else:
                self.db.execute(query + " AND sink=?", (now, error, incident_id, sink))

    def plot_failed(self, incident_id: int, sink: str, error: str) -> None:
        with self.transaction():
            self.db.execute("UPDATE plots SET attempts=attempts+1, error=? WHERE incident_id=? AND sink=?", (error, incident_id, sink))
