"""An incident's picture, after its alert: drawn once into <state dir>/plots, then shown by each
sink that takes pictures (the Slack bot uploads it into the incident's thread; the JSON-lines and
console sinks name the file).

Pictures are extras: they never hold up or cost an alert. The daemon sends them in a job of its
own, on a state connection of its own, drawn in a child process (plot.draw: ~1 s, which the next
alert does not wait for), and only once the alert they follow was delivered to that sink (so a
Slack upload has the alert's thread to go into). A picture that cannot be drawn, or
that its sink refused for good or ATTEMPTS times, is given up with one log line; the alert stands.

After a kill -9 between a sink's answer and the commit that records it, the picture is shown again
(as an outbox entry would be): one more copy of an image in a thread, never a lost alert.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..escaping import printable
from ..redact import scrub
from .picture import Picture, PlotError, draw, shown_trouble
from ..state import PlotRow, State
from .delivery import Delivery, Sink

log = logging.getLogger("lossguard")
PER_ROUND = 10
"""Pictures taken from the state at a time."""
ATTEMPTS = 3
KEEP_DAYS = 30
"""A picture is kept this long after it was drawn (the JSONL sink names the file; a picture still
due after that is drawn again from the state): a daemon running for months must not fill its disk."""
PRUNE_EVERY = 3600.0


@dataclass(frozen=True)
class Plot:
    """A drawn picture for one sink: the file, the incident it shows, where it goes."""

    path: Path
    picture: Picture
    thread: str | None
    """`channel|ts` of the incident's Slack thread."""
    key: str
    """`<alert's outbox key>-plot`: unique, for sinks that deduplicate."""
    alert_key: str

    @property
    def title(self) -> str:
        inc = self.picture.incident
        return printable(f"{inc.run}: {inc.metric} {shown_trouble(inc)} at step {inc.step}")


def _what(row: PlotRow) -> str:
    """"run R, step N" from the stored picture, for a log line (whatever is left of it)."""
    try:
        inc = json.loads(row.picture)["incident"]
        return f"run {inc['run']}, step {inc['step']}"
    except (ValueError, KeyError, TypeError):
        return "its picture is unreadable"


def takes_plots(sink: Sink) -> bool:
    return bool(getattr(sink, "takes_plots", False))


class Plotter:
    """Draws and sends the pictures the state holds for delivered alerts (see the module's doc)."""

    def __init__(self, state: State, sinks: Mapping[str, Sink], *, directory: Path, wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.sinks = dict(sinks)
        self.directory = directory
        self.wall = wall
        """Stamps and a picture's age (files' mtimes are wall time)."""
        self.clock = clock
        """How long since the last prune: a duration, which a clock stepped back must not stretch."""
        self._pruned: float | None = None

    def path_of(self, incident_id: int) -> Path:
        """The PNG's name: the state's id and the incident's (never a name from disk)."""
        return self.directory / f"{self.state.id}-{incident_id}.png"

    def round(self) -> int:
        if self._pruned is None or self.clock() - self._pruned >= PRUNE_EVERY:
            self._pruned = self.clock()
            self.prune()
        shown, undrawable = 0, set()
        for row in self.state.due_plots(PER_ROUND):
            if row.incident_id in undrawable:  # (given up for every sink just now)
                continue
            sink = self.sinks.get(row.sink)
            if sink is None or not takes_plots(sink):
                self.state.plot_done(row.incident_id, row.sink, now=self.wall(), error="the sink takes no pictures (any more)")
                continue
            try:
                pic = Picture.from_json(json.loads(row.picture))
                path = self._drawn(row.incident_id, pic)
            except (PlotError, ValueError, KeyError, TypeError) as exc:
                log.warning("no plot for incident %d (%s): %s; its alert went without it", row.incident_id, _what(row), exc)
                self.state.plot_done(row.incident_id, None, now=self.wall(), error=str(exc))
                undrawable.add(row.incident_id)
                continue
            delivery = self._send(sink, Plot(path, pic, row.thread, f"{row.alert_key}-plot", row.alert_key))
            if delivery.ok:
                self.state.plot_done(row.incident_id, row.sink, now=self.wall())
                shown += 1
            elif delivery.permanent or row.attempts + 1 >= ATTEMPTS:
                log.warning("the plot of %s did not reach %s (%s); its alert went without it", pic.incident.run, sink.name, delivery.describe())
                self.state.plot_done(row.incident_id, row.sink, now=self.wall(), error=delivery.describe())
            else:
                self.state.plot_failed(row.incident_id, row.sink, delivery.describe())
                break  # (the sink is struggling: the next round tries again)
        return shown

    def prune(self) -> int:
        """Removes the pictures drawn more than KEEP_DAYS ago; how many."""
        oldest, gone = self.wall() - KEEP_DAYS * 86400, 0
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return 0  # none drawn yet (or the folder went): nothing to keep small
        for entry in entries:
            try:
                if entry.name.endswith(".png") and entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < oldest:
                    os.unlink(entry.path)
                    gone += 1
            except OSError as exc:
                log.warning("cannot remove the old picture %s: %s", printable(entry.path), exc.strerror or exc)
        return gone

    def _drawn(self, incident_id: int, pic: Picture) -> Path:
        """The incident's PNG, drawn the first time a sink asks for it (written whole: if it is
        there, it is complete)."""
        path = self.path_of(incident_id)
        if path.exists():
            return path
        try:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.directory, 0o700)
        except OSError as exc:
            raise PlotError(f"cannot create {self.directory}: {exc.strerror or exc}") from None
        return draw(pic, path, cache_dir=self.directory / ".matplotlib")

    @staticmethod
    def _send(sink: Sink, plot: Plot) -> Delivery:
        try:
            return sink.send_plot(plot)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - a picture must never cost the sender its round
            return Delivery(ok=False, error=scrub(f"{type(exc).__name__}: {exc}"), permanent=True)
