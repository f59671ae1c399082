"""The state's reads of what it judged: the runs (their last step, whether they stalled) and the
incidents raised on them, one run at a time or many at once (a pass over hundreds of busy runs
asks in one query per CHUNK of them)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..model import Incident, split_rank

from .columns import INCIDENT, INCIDENT_RUN, RUN, chunks, incident_row, marks, run_row
from .rows import IncidentRow, RunRow
from .transaction import Connected


def rank_range(run: str) -> tuple[str, str]:
    """The bounds of the names of `run`'s rank streams (`run [rank N]`, model.ranked), as a range
    the tables' indexes on `run` answer (a job of 512 ranks asks once per rank's incident)."""
    prefix = f"{run} [rank "
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


class RunsAndIncidents(Connected):
    """State's reads of the `runs` and `incidents` tables (a pass writes them through Transaction)."""

    def incident_keys_of(self, since: Mapping[str, int]) -> dict[str, frozenset[tuple[str, int]]]:
        """`incident_keys` of many runs (run -> since) in one query per 500 runs."""
        found: dict[str, set[tuple[str, int]]] = {}
        for chunk in chunks(list(since)):
            values = ",".join(["(?,?)"] * len(chunk))
            rows = self.db.execute(
                f"WITH w(run, since) AS (VALUES {values}) SELECT i.run, i.rule, i.step FROM incidents i JOIN w ON i.run = w.run AND i.step >= w.since",
                [x for run in chunk for x in (run, since[run])],
            )
            for run, rule, step in rows:
                found.setdefault(run, set()).add((rule, step))
        return {run: frozenset(keys) for run, keys in found.items()}

    def open_incidents_of(self, runs: Sequence[str]) -> dict[str, list[IncidentRow]]:
        """`open_incidents` of many runs in one query per 500 runs (runs with none left out)."""
        out: dict[str, list[IncidentRow]] = {}
        for chunk in chunks(runs):
            for r in self.db.execute(f"{INCIDENT_RUN} WHERE status='open' AND run IN ({marks(chunk)}) ORDER BY id", chunk):
                out.setdefault(r[0], []).append(incident_row(r[1:]))
        return out

    def runs_of(self, runs: Sequence[str]) -> dict[str, RunRow]:
        """`run` of many runs in one query per 500 runs (runs not known yet left out)."""
        out = {}
        for chunk in chunks(runs):
            for r in self.db.execute(f"{RUN} WHERE run IN ({marks(chunk)})", chunk):
                out[r[0]] = run_row(r)
        return out

    def incident(self, run: str, rule: str, step: int, timeline: int | None = None) -> IncidentRow | None:
        """The incident (run, rule, step) on `timeline` (model.Incident.timeline); None: on its
        latest timeline (the grad-norm spike a loss spike follows is the last one at its step)."""
        if timeline is None:
            row = self.db.execute(f"{INCIDENT} WHERE run=? AND rule=? AND step=? ORDER BY timeline DESC LIMIT 1", (run, rule, step)).fetchone()
        else:
            row = self.db.execute(f"{INCIDENT} WHERE run=? AND rule=? AND step=? AND timeline=?", (run, rule, step, timeline)).fetchone()
        return None if row is None else incident_row(row)

    def incident_keys(self, run: str, *, since: int) -> frozenset[tuple[str, int]]:
        """(rule, first step) of the run's incidents that start at or after `since`."""
        rows = self.db.execute("SELECT rule, step FROM incidents WHERE run=? AND step>=?", (run, since))
        return frozenset((rule, step) for rule, step in rows)

    def open_incidents(self, run: str) -> list[IncidentRow]:
        return [incident_row(r) for r in self.db.execute(f"{INCIDENT} WHERE run=? AND status='open'", (run,))]

    def firing(self) -> tuple[list[IncidentRow], list[RunRow]]:
        """What is wrong right now and was said (not history found at the first start): the open
        incidents and the stalled runs, which a sink whose receiver forgets (Alertmanager) is told
        again and again."""
        # (An incident whose own stream recovered is still firing while a rank that joined it is not.)
        held = "(status='open' OR EXISTS (SELECT 1 FROM incidents j WHERE j.joined=incidents.id AND j.status='open'))"
        incidents = [incident_row(r) for r in self.db.execute(f"{INCIDENT} WHERE {held} AND quiet=0 AND folded=0 AND joined IS NULL ORDER BY id")]
        incidents = [r if r.status == "open" else replace(r, status="open", incident=replace(r.incident, end_step=None)) for r in incidents]
        runs = [run_row(r) for r in self.db.execute(f"{RUN} WHERE stalled=1 ORDER BY run")]
        return incidents, runs

    def recorded_as(self, incident_id: int) -> tuple[bool, int | None]:
        """(folded, joined) of an incident: folded into its run's noisy notice (and not alerted
        since); the incident of another rank it joined (said by that one, never on its own)."""
        row = self.db.execute("SELECT folded, joined FROM incidents WHERE id=?", (incident_id,)).fetchone()
        return (bool(row[0]), row[1]) if row else (False, None)

    def rank_event(self, run: str, rule: str, *, timeline: int, upto: int, crash: bool) -> list[IncidentRow]:
        """The incidents of `run`'s rank streams (`run` is a stream's base name, as model.split_rank
        gives it), of `rule` (any crash, with
        `crash`; at any step: each rank dies at the step it had reached), else starting at or before
        step `upto`, on `timeline`: the latest first, those a new incident of one rank may be the
        same event as (detection.ranks.same_event tells)."""
        which = ("json_extract(body, '$.error') IS NOT NULL", ()) if crash else ("rule=? AND step<=?", (rule, upto))
        rows = self.db.execute(
            # (Crashes newest first: a restarted job's old crash, all its ranks at one step, must not hide a new one.)
            f"{INCIDENT} WHERE run >= ? AND run < ? AND timeline=? AND {which[0]} ORDER BY {'id DESC' if crash else 'step DESC, id DESC'} LIMIT 16",
            (*rank_range(run), timeline, *which[1]),
        )
        return [incident_row(r) for r in rows]

    def paced(self, run: str, *, upto: int) -> list[IncidentRow]:
        """The run's slowdowns and stragglers (kinds `throughput`, `straggler`) starting at or before
        step `upto`: the latest first."""
        rows = self.db.execute(
            f"{INCIDENT} WHERE run=? AND step<=? AND json_extract(body, '$.kind') IN ('throughput', 'straggler') "
            "ORDER BY step DESC, id DESC LIMIT 16", (run, upto),
        )
        return [incident_row(r) for r in rows]

    def latest_incident(self, run: str, rule: str, *, timeline: int) -> IncidentRow | None:
        """The run's incident of `rule` on `timeline` that starts last."""
        row = self.db.execute(f"{INCIDENT} WHERE run=? AND rule=? AND timeline=? ORDER BY step DESC, id DESC LIMIT 1", (run, rule, timeline)).fetchone()
        return None if row is None else incident_row(row)

    def ranks_running(self, run: str, *, but: str) -> int:
        """How many of `run`'s rank streams other than `but` are not marked stalled."""
        lo, hi = rank_range(run)
        return int(self.db.execute("SELECT count(*) FROM runs WHERE run >= ? AND run < ? AND run != ? AND stalled=0", (lo, hi, but)).fetchone()[0])

    def rank_streams(self, run: str) -> list[str]:
        """The rank streams of `run` (model.ranked names them) the state keeps tails of."""
        return [r for (r,) in self.db.execute("SELECT DISTINCT run FROM streams WHERE run >= ? AND run < ?", rank_range(run))]

    def launched_crashes(self, folder: str) -> list[IncidentRow]:
        """The crashes of the rank streams of a torchrun run folder (`.../<folder> [rank N]`): those
        a launcher's crash, its table naming that folder, is the same failure as. The latest first."""
        rows = self.db.execute(
            f"{INCIDENT} WHERE instr(run, ?) > 0 AND json_extract(body, '$.error') IS NOT NULL ORDER BY id DESC LIMIT 16", (f"{folder} [rank ",),
        )
        found = [incident_row(r) for r in rows]
        return [row for row in found if split_rank(row.incident.run)[0].rsplit("/", 1)[-1] == folder]

    def open_joined(self, incident_id: int) -> int:
        """How many incidents that joined this one (other ranks' of the same event) are still open."""
        return int(self.db.execute("SELECT count(*) FROM incidents WHERE joined=? AND status='open'", (incident_id,)).fetchone()[0])

    def incident_of(self, incident_id: int) -> IncidentRow | None:
        row = self.db.execute(f"{INCIDENT} WHERE id=?", (incident_id,)).fetchone()
        return None if row is None else incident_row(row)

    def firings(self, run: str, rule: str, *, before: int, limit: int = 50) -> list[Incident]:
        """The rule's last `limit` firings on the run that start before step `before` (on any
        timeline: the run's noise is the run's), for the usual size of its firings."""
        rows = self.db.execute("SELECT body FROM incidents WHERE run=? AND rule=? AND step<? ORDER BY id DESC LIMIT ?", (run, rule, before, limit))
        return [Incident.from_json(json.loads(body)) for (body,) in rows]

    def fold_counts(self, run: str, rule: str) -> tuple[int, int, tuple[float, int] | None]:
        """The rule's firings on the run, how many were folded, and the largest folded (ratio, step)."""
        fired, folded = self.db.execute("SELECT count(*), coalesce(sum(folded), 0) FROM incidents WHERE run=? AND rule=?", (run, rule)).fetchone()
        largest = self.db.execute(
            "SELECT json_extract(body, '$.value') / json_extract(body, '$.baseline') AS r, step FROM incidents "
            "WHERE run=? AND rule=? AND folded=1 ORDER BY r DESC LIMIT 1", (run, rule),
        ).fetchone()
        return int(fired), int(folded), (float(largest[0]), int(largest[1])) if largest and largest[0] is not None else None

    def run(self, run: str) -> RunRow | None:
        row = self.db.execute(f"{RUN} WHERE run=?", (run,)).fetchone()
        return None if row is None else run_row(row)

    def runs(self) -> list[RunRow]:
        return [run_row(r) for r in self.db.execute(RUN)]
