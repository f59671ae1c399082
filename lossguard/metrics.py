"""Prometheus metrics for `lossguard watch`: served on `/metrics` (`metrics_listen`) or written in
node_exporter's textfile format (`metrics_textfile`). This module owns prometheus-client.

What a run looks like (last step, last update, latest values, open incidents, spikes, stalled) is
read from the state at scrape time, on a read-only connection of its own (`state.StateReader`): a
scrape never takes the pass lock, and in WAL mode a reader neither waits for a pass's commit nor
delays it, so scraping cannot make an alert late. The daemon's own health (passes, read problems,
deliveries) is counted in memory as it happens. Runs that logged nothing for `run_ttl` seconds are
left out, so the series stay bounded however many runs a box has seen."""

from __future__ import annotations

import bisect
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from . import __version__
from .errors import LossguardError
from .settings import Endpoint
from .state import StateReader

log = logging.getLogger("lossguard")

VALUES = {"loss": "loss", "lr": "learning_rate", "grad_norm": "grad_norm", "loss_scale": "loss_scale"}
"""The canonical metrics shown per run, and the name each has in Prometheus."""
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""A quiet pass takes a few ms, a busy one ~20 ms, 100 busy runs ~1 s, a long history tens of s."""
DAY = 86400.0
TEXTFILE_EVERY = 15.0
"""Seconds between two writes of the textfile: node_exporter's usual scrape interval."""


class MetricsError(LossguardError):
    """The metrics cannot be served or written where the settings say (port taken, no such folder)."""


class Health:
    """The daemon's own counts, updated by the pass and delivery threads as things happen."""

    def __init__(self, sinks: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self.passes = 0
        self.pass_seconds = 0.0
        self.buckets = [0] * (len(PASS_BUCKETS) + 1)
        self.problems = 0
        self.delivered: Counter[str] = Counter({s: 0 for s in sinks})
        self.failed: Counter[str] = Counter({s: 0 for s in sinks})

    def passed(self, seconds: float, *, problems: int = 0) -> None:
        with self._lock:
            self.passes += 1
            self.pass_seconds += seconds
            self.buckets[bisect.bisect_left(PASS_BUCKETS, seconds)] += 1
            self.problems += problems

    def delivery(self, sink: str, ok: bool) -> None:
        """One post to `sink`: accepted, or failed (retried later or waiting for the operator)."""
        with self._lock:
            (self.delivered if ok else self.failed)[sink] += 1

    def copy(self) -> tuple[int, float, list[int], int, dict[str, int], dict[str, int]]:
        with self._lock:
            return self.passes, self.pass_seconds, list(self.buckets), self.problems, dict(self.delivered), dict(self.failed)


class LossguardCollector(Collector):
    """Every lossguard series, built at scrape time from the state and the in-memory counts."""

    def __init__(self, reader: StateReader, health: Health, *, run_ttl: float = DAY, host: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.reader = reader
        self.health = health
        self.run_ttl = run_ttl
        self.host = host or socket.gethostname()
        self.clock = clock

    def collect(self) -> Iterator:
        yield from self._daemon()
        try:
            yield from self._runs()
        except LossguardError as exc:  # a state briefly unreadable costs the run series, not the scrape
            log.warning("metrics: %s", exc)

    def _daemon(self) -> Iterator:
        passes, seconds, buckets, problems, delivered, failed = self.health.copy()
        info = InfoMetricFamily("lossguard_build", "lossguard's version.", labels=["version"])
        info.add_metric([__version__], {})
        yield info
        yield CounterMetricFamily("lossguard_passes", "Passes over the followed files.", value=passes)
        cumulative, running = [], 0
        for bound, n in zip([*map(str, PASS_BUCKETS), "+Inf"], buckets):
            running += n
            cumulative.append((bound, running))
        yield HistogramMetricFamily("lossguard_pass_duration_seconds", "Wall time of a pass.", buckets=cumulative, sum_value=seconds)
        yield CounterMetricFamily("lossguard_read_problems", "Problems met reading logs (unreadable bytes, a file gone mid-read...).", value=problems)
        ok = CounterMetricFamily("lossguard_deliveries", "Posts a sink accepted.", labels=["sink"])
        bad = CounterMetricFamily("lossguard_delivery_failures", "Posts a sink refused or could not be reached for.", labels=["sink"])
        for sink in sorted(delivered):
            ok.add_metric([sink], delivered[sink])
        for sink in sorted(failed):
            bad.add_metric([sink], failed[sink])
        yield ok
        yield bad

    def _runs(self) -> Iterator:
        r = self.reader
        now = self.clock()
        yield GaugeMetricFamily("lossguard_files_followed", "Log files followed (a file its reader gave up on is not).", value=r.files_followed())
        backlog = r.backlog()
        yield GaugeMetricFamily("lossguard_outbox_pending", "Notifications not delivered yet (failed permanently included).", value=backlog.pending)
        age = 0.0 if backlog.oldest_created is None else max(0.0, now - backlog.oldest_created)
        yield GaugeMetricFamily("lossguard_outbox_oldest_pending_age_seconds", "Age of the oldest undelivered notification (0: none).", value=age)
        yield GaugeMetricFamily("lossguard_state_size_bytes", "state.db and its write-ahead log on disk.", value=r.size_bytes())

        runs = r.live_runs(since=now - self.run_ttl)
        live = {row.run for row in runs}
        labels = ["run", "host"]
        step = GaugeMetricFamily("lossguard_run_last_step", "The last step the run logged.", labels=labels)
        update = GaugeMetricFamily("lossguard_run_last_update_timestamp_seconds", "When the run last logged a new step (unix time).", labels=labels)
        stalled = GaugeMetricFamily("lossguard_run_stalled", "1 when the run was reported stalled (no new step for stall_after).", labels=labels)
        for row in runs:
            key = [row.run, self.host]
            if row.last_step is not None:
                step.add_metric(key, row.last_step)
            update.add_metric(key, row.advanced_at)
            stalled.add_metric(key, float(row.stalled))
        yield from (step, update, stalled)
        families = {m: GaugeMetricFamily(f"lossguard_run_{name}", f"The run's latest {name.replace('_', ' ')}.", labels=labels) for m, name in VALUES.items()}
        for (run, metric), value in sorted(r.latest_values(list(VALUES)).items()):
            if run in live:
                families[metric].add_metric([run, self.host], value)
        yield from families.values()
        open_ = GaugeMetricFamily("lossguard_run_open_incidents", "Incidents still open, by severity.", labels=[*labels, "severity"])
        for (run, severity), n in sorted(r.open_incidents_by_severity().items()):
            if run in live:
                open_.add_metric([run, self.host, severity], n)
        yield open_
        spikes = CounterMetricFamily("lossguard_run_spikes", "Incidents (spikes) raised, by rule.", labels=[*labels, "rule"])
        for (run, rule), n in sorted(r.incidents_by_rule().items()):
            if run in live:
                spikes.add_metric([run, self.host, rule], n)
        yield spikes


class Metrics:
    """The daemon's metrics: count with `health`, then `start` serving and/or writing them."""

    def __init__(self, state_path: Path, *, sinks: Sequence[str], listen: Endpoint | None = None, textfile: Path | None = None, run_ttl: float = DAY) -> None:
        self.listen, self.textfile = listen, textfile
        self.health = Health(sinks)
        self.reader = StateReader(state_path)
        self.collector = LossguardCollector(self.reader, self.health, run_ttl=run_ttl)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._server = None
        self._textfile_failed = False

    def start(self) -> None:
        """Listen now, so a port already taken stops the daemon at start with one line."""
        if self.textfile is not None and not self.textfile.parent.is_dir():
            raise MetricsError(f"metrics_textfile: {self.textfile.parent}: no such folder")
        if self.listen is None:
            return
        served = CollectorRegistry(auto_describe=False)
        served.register(self.collector)
        ProcessCollector(registry=served)  # (not in the textfile: node_exporter has process_* of its own)
        try:
            self._server, _ = start_http_server(self.listen.port, addr=self.listen.host, registry=served)
        except OSError as exc:
            raise MetricsError(f"metrics_listen: {self.listen}: cannot listen: {exc.strerror or exc}") from None
        log.info("serving metrics on http://%s/metrics", self.listen)

    def write_textfile(self) -> None:
        """Written whole to a temporary file, then renamed over the old one (node_exporter never
        reads half a file). A failure is logged once until a write succeeds again."""
        if self.textfile is None:
            return
        try:
            write_to_textfile(str(self.textfile), self.registry)
        except OSError as exc:
            if not self._textfile_failed:
                log.warning("metrics: cannot write %s: %s", self.textfile, exc.strerror or exc)
            self._textfile_failed = True
        else:
            self._textfile_failed = False

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.reader.close()

