"""Prometheus metrics for `lossguard watch`: served on `/metrics` (`metrics_listen`) or written in
node_exporter's textfile format (`metrics_textfile`). This module owns prometheus-client.

What a run looks like (last step, last update, latest values, open incidents, spikes, stalled) is
read from the state at scrape time, on a read-only connection of its own (`state.StateReader`): a
scrape never takes the pass lock, and in WAL mode a reader neither waits for a pass's commit nor
delays it, so scraping cannot make an alert late. The daemon's own health (passes, read problems,
deliveries) is counted in memory as it happens. Runs that logged nothing for `run_ttl` seconds are
left out, so the series stay bounded however many runs a box has seen. The runs' text is rendered
again only when a pass has committed since (`Exposition`): prometheus-client formats ~7,000 samples
for 1,000 runs in ~40 ms, too much to pay at every scrape of an idle box."""

from __future__ import annotations

import bisect
import logging
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..version import __version__
from ..errors import LossguardError
from .settings import Endpoint
from ..state import StateReader

log = logging.getLogger("lossguard")

VALUES = {"loss": "loss", "lr": "learning_rate", "grad_norm": "grad_norm", "loss_scale": "loss_scale"}
"""The canonical metrics shown per run, and the name each has in Prometheus."""
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""A quiet pass takes a few ms, a busy one ~20 ms, 100 busy runs ~1 s, a long history tens of s."""
DAY = 86400.0
TEXTFILE_EVERY = 15.0
"""Seconds between two writes of the textfile: node_exporter's usual scrape interval."""
IDLE_TIMEOUT = 5.0
"""Seconds a connection may keep /metrics waiting for its request (a scrape sends it at once)."""
MAX_CONNECTIONS = 32
"""Connections served at once; one more is closed as it is accepted. Each holds a file descriptor
and a thread: without a cap, idle connections took every descriptor the daemon had (1,011 under
systemd's 1,024), so it could open no log, no state, no socket to Slack, and alerted nothing."""
CONNECTION_DEADLINE = 15.0
"""Seconds a connection may last in all: a scrape takes milliseconds (Prometheus gives up at 10 s)."""


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


class DaemonCollector(Collector):
    """The daemon's health: counted in memory, plus a few cheap reads (files, outbox, size)."""

    def __init__(self, reader: StateReader, health: Health, *, clock: Callable[[], float] = time.time) -> None:
        self.reader, self.health, self.clock = reader, health, clock

    def collect(self) -> Iterator:
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
        try:
            r = self.reader
            yield GaugeMetricFamily("lossguard_files_followed", "Log files followed (a file its reader gave up on is not).", value=r.files_followed())
            backlog = r.backlog()
            yield GaugeMetricFamily("lossguard_outbox_pending", "Notifications not delivered yet (failed permanently included).", value=backlog.pending)
            age = 0.0 if backlog.oldest_created is None else max(0.0, self.clock() - backlog.oldest_created)
            yield GaugeMetricFamily("lossguard_outbox_oldest_pending_age_seconds", "Age of the oldest undelivered notification (0: none).", value=age)
            yield GaugeMetricFamily("lossguard_state_size_bytes", "state.db and its write-ahead log on disk.", value=r.size_bytes())
        except LossguardError as exc:  # a state briefly unreadable costs these series, not the scrape
            log.warning("metrics: %s", exc)


class RunCollector(Collector):
    """Each run's series, labelled run and host. Only runs with a new step within `run_ttl` are
    shown; `expires` says when the oldest of them leaves (the exposition is cached until then, or
    until a pass commits)."""

    def __init__(self, reader: StateReader, *, run_ttl: float = DAY, host: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.reader = reader
        self.run_ttl = run_ttl
        self.host = host or socket.gethostname()
        self.clock = clock
        self.expires = float("inf")
        self._lines: dict[str, tuple[str, ...]] = {}
        """Per run: its lines as last rendered (one string a family)."""
        self._seq = -1
        """The commit (`runs.touched`) the cached lines are up to date with."""

    def collect(self) -> Iterator:
        """As prometheus-client's families (for a registry); `rows` is what a scrape renders."""
        for fam in self.rows():
            cls = CounterMetricFamily if fam.type == "counter" else GaugeMetricFamily
            out = cls(fam.name, fam.doc, labels=list(fam.labels))
            for values, value in fam.samples:
                out.add_metric(list(values), value)
            yield out

    def rows(self) -> list[Family]:
        try:
            return self._families()
        except LossguardError as exc:
            log.warning("metrics: %s", exc)
            self.expires = 0.0
            return []

    def _live(self) -> list:
        """The runs within the ttl; `expires` is set to when the oldest of them leaves."""
        runs = self.reader.live_runs(since=self.clock() - self.run_ttl)
        self.expires = min((row.advanced_at for row in runs), default=float("inf")) + self.run_ttl
        return runs

    def _empty_families(self) -> list[Family]:
        labels = ("run", "host")
        return [
            Family("lossguard_run_last_step", "The last step the run logged.", "gauge", labels),
            Family("lossguard_run_last_update_timestamp_seconds", "When the run last logged a new step (unix time).", "gauge", labels),
            Family("lossguard_run_stalled", "1 when the run was reported stalled (no new step for stall_after).", "gauge", labels),
            *(Family(f"lossguard_run_{name}", f"The run's latest {name.replace('_', ' ')}.", "gauge", labels) for name in VALUES.values()),
            Family("lossguard_run_open_incidents", "Incidents still open and alerted, by severity.", "gauge", (*labels, "severity")),
            Family("lossguard_run_folded_incidents", "Open incidents folded into the run's noisy notice: recorded, not alerted.", "gauge", labels),
            Family("lossguard_run_spikes", "Incidents (spikes) raised, by rule.", "counter", (*labels, "rule")),
        ]

    def _families(self) -> list[Family]:
        r = self.reader
        runs, latest = self._live(), r.latest_values(list(VALUES))
        extra = _incidents_by_run(r.open_incidents_by_severity(), r.incidents_by_rule())
        folded = r.folded_incidents()
        families = self._empty_families()
        host = self.host
        for row in runs:
            key = (row.run, host)
            opened, spiked = extra.get(row.run, ((), ()))
            samples = (
                [(key, row.last_step)] if row.last_step is not None else [], [(key, row.advanced_at)], [(key, float(row.stalled))],
                *([(key, latest[(row.run, m)])] if (row.run, m) in latest else [] for m in VALUES),
                [((row.run, host, severity), n) for severity, n in opened], [(key, folded[row.run])] if row.run in folded else [],
                [((row.run, host, rule), n) for rule, n in spiked],
            )
            for family, some in zip(families, samples):
                family.samples.extend(some)
        return families

    def text(self) -> bytes:
        """The runs' part of a scrape, as text_format would write rows(). A run's lines are rendered
        again only when a commit changed its data since the last time (`StateReader.touched`): a
        pass commits the runs it read, mostly a few of many, and the rest are joined as they were."""
        r = self.reader
        try:
            seq, changed = r.touched(self._seq)
            runs = self._live()
            cache = self._lines
            need = {row.run for row in runs if row.run in changed or row.run not in cache}
            some = need if len(need) * 4 < len(runs) else None  # (most runs changed: one scan beats a long IN list)
            data = (
                (r.latest_values(list(VALUES), some), r.open_incidents_by_severity(some), r.incidents_by_rule(some), r.folded_incidents(some))
                if need else ({}, {}, {}, {})
            )
        except LossguardError as exc:
            log.warning("metrics: %s", exc)
            self.expires = 0.0
            return b""
        families = self._empty_families()
        latest, extra = data[0], _incidents_by_run(data[1], data[2])
        host = _label_value(self.host)
        kept: dict[str, tuple[str, ...]] = {}
        columns: list[list[str]] = [[] for _ in families]
        for row in runs:
            lines = cache[row.run] if row.run not in need else _run_lines(row, host, latest, *extra.get(row.run, ((), ())), folded=data[3].get(row.run))
            kept[row.run] = lines
            for column, text in zip(columns, lines):
                column.append(text)
        self._lines, self._seq = kept, seq  # (runs past their ttl leave the cache)
        return "".join(_head(f) + "".join(column) for f, column in zip(families, columns)).encode()


def _incidents_by_run(opened: dict[tuple[str, str], int], spikes: dict[tuple[str, str], int]) -> dict[str, tuple[list, list]]:
    """run -> ([(severity, open incidents)], [(rule, spikes)]), each sorted."""
    out: dict[str, tuple[list, list]] = {}
    for (run, severity), n in sorted(opened.items()):
        out.setdefault(run, ([], []))[0].append((severity, n))
    for (run, rule), n in sorted(spikes.items()):
        out.setdefault(run, ([], []))[1].append((rule, n))
    return out


_VALUE_NAMES = tuple((m, f"lossguard_run_{name}") for m, name in VALUES.items())


def _run_lines(row, host: str, latest: dict, opened, spiked, *, folded: int | None) -> tuple[str, ...]:  # noqa: ANN001
    """One run's lines, family by family, as text_format writes them (label names sorted: host, run
    and then rule or severity; a test holds the two byte-identical); written out by hand because a
    scrape after a pass over every run renders them all."""
    run = _label_value(row.run)
    lab = f'{{host="{host}",run="{run}"}}'
    go = floatToGoString
    return (
        f"lossguard_run_last_step{lab} {go(row.last_step)}\n" if row.last_step is not None else "",
        f"lossguard_run_last_update_timestamp_seconds{lab} {go(row.advanced_at)}\n",
        f"lossguard_run_stalled{lab} {'1.0' if row.stalled else '0.0'}\n",
        *(f"{name}{lab} {go(latest[(row.run, m)])}\n" if (row.run, m) in latest else "" for m, name in _VALUE_NAMES),
        "".join(f'lossguard_run_open_incidents{{host="{host}",run="{run}",severity="{_label_value(sev)}"}} {go(n)}\n' for sev, n in opened),
        f"lossguard_run_folded_incidents{lab} {go(folded)}\n" if folded else "",
        "".join(f'lossguard_run_spikes_total{{host="{host}",rule="{_label_value(rule)}",run="{run}"}} {go(n)}\n' for rule, n in spiked),
    )


@dataclass
class Family:
    """A metric family as plain data: what the runs' part of a scrape is rendered from directly
    (prometheus-client's families cost more to build than the text does to write)."""

    name: str
    doc: str
    type: str
    labels: tuple[str, ...]
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)


def _label_value(v: str) -> str:
    if "\\" not in v and "\n" not in v and '"' not in v:
        return v
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _head(family: Family) -> str:
    doc = family.doc.replace("\\", "\\\\").replace("\n", "\\n")
    name = family.name + ("_total" if family.type == "counter" else "")
    return f"# HELP {name} {doc}\n# TYPE {name} {family.type}\n"


def text_format(families: Iterable[Family]) -> bytes:
    """The Prometheus text format of gauge and counter families, as prometheus-client's
    generate_latest writes it (a test holds them byte-identical), at a fraction of its cost; what
    `RunCollector.text` writes run by run is held byte-identical to this."""
    out: list[str] = []
    memo: dict[tuple, str] = {}  # a run's label set repeats in each of its families: escaped once
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        out.append(_head(family))
        order = sorted(range(len(family.labels)), key=lambda k: family.labels[k])  # names sorted, as generate_latest does
        for values, value in family.samples:
            key = (family.labels, values)
            inner = memo.get(key)
            if inner is None:
                inner = memo[key] = "{" + ",".join(f'{family.labels[k]}="{_label_value(values[k])}"' for k in order) + "}" if order else ""
            out.append(f"{name}{inner} {floatToGoString(value)}\n")
    return "".join(out).encode()


class Exposition:
    """The text a scrape gets. The runs' part is most of it (7 series a run) and changes only when
    a pass commits: it is rendered again only then (SQLite's data_version says so) or when a run's
    ttl runs out, so an idle box with 1,000 runs pays for rendering once, not at every scrape. The
    daemon's part is small and rendered every time."""

    def __init__(self, reader: StateReader, health: Health, *, run_ttl: float = DAY, host: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.reader, self.clock = reader, clock
        self.runs = RunCollector(reader, run_ttl=run_ttl, host=host, clock=clock)
        self._runs = CollectorRegistry(auto_describe=False)
        self._runs.register(self.runs)
        self._daemon = CollectorRegistry(auto_describe=False)
        self._daemon.register(DaemonCollector(reader, health, clock=clock))
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        self._lock = threading.Lock()
        self._cached: tuple[int, bytes] | None = None

    def render(self, *, process: bool = True) -> bytes:
        """`process`: with the process_* series (not in node_exporter's textfile: it has its own)."""
        with self._lock:
            try:
                version = self.reader.data_version()
            except LossguardError:
                version = -1
            if self._cached is None or self._cached[0] != version or version < 0 or self.clock() >= self.runs.expires:
                self._cached = (version, self.runs.text())
            runs = self._cached[1]
        return runs + generate_latest(self._daemon) + (generate_latest(self._process) if process else b"")


class Metrics:
    """The daemon's metrics: count with `health`, then `start` serving and/or writing them."""

    def __init__(self, state_path: Path, *, sinks: Sequence[str], listen: Endpoint | None = None, textfile: Path | None = None, run_ttl: float = DAY) -> None:
        self.listen, self.textfile = listen, textfile
        self.health = Health(sinks)
        self.reader = StateReader(state_path)
        self.exposition = Exposition(self.reader, self.health, run_ttl=run_ttl)
        self._server = None
        self._textfile_failed = False

    def start(self) -> None:
        """Listen now, so a port already taken stops the daemon at start with one line."""
        if self.textfile is not None and not self.textfile.parent.is_dir():
            raise MetricsError(f"metrics_textfile: {self.textfile.parent}: no such folder")
        if self.listen is None:
            return
        family = socket.AF_INET6 if ":" in self.listen.host else socket.AF_INET
        server_class = type("Server", (_Server,), {"address_family": family})
        try:
            self._server = make_server(self.listen.host, self.listen.port, self._app, server_class, handler_class=_Quiet)
        except OSError as exc:
            raise MetricsError(f"metrics_listen: {self.listen}: cannot listen: {exc.strerror or exc}") from None
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()
        log.info("serving metrics on http://%s/metrics", self.listen)

    def _app(self, environ: dict, start_response: Callable) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics\n"]
        body = self.exposition.render()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Content-Length", str(len(body)))])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    def write_textfile(self) -> None:
        """Written whole to a temporary file beside it, then renamed over the old one: node_exporter
        never reads half a file. A failure is logged once until a write succeeds again."""
        if self.textfile is None:
            return
        tmp = self.textfile.with_name(f".{self.textfile.name}.{os.getpid()}.tmp")  # (not *.prom: never read by node_exporter)
        try:
            tmp.write_bytes(self.exposition.render(process=False))
            os.replace(tmp, self.textfile)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
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


class _Server(ThreadingWSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS of them: one beyond is closed at once (its
    scraper tries again), so connections left open cannot take the descriptors and threads that
    following logs and delivering alerts need."""

    max_connections = MAX_CONNECTIONS
    deadline = CONNECTION_DEADLINE
    request_queue_size = 64  # (the kernel holds these without a descriptor of ours)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._refused = 0

    def process_request(self, request: socket.socket, client_address: object) -> None:
        if not self._slots.acquire(blocking=False):
            self._refused += 1
            if self._refused in (1, 1000) or self._refused % 100_000 == 0:  # said, but never a line per connection
                log.warning("metrics: %d connections open already (the most served at once); closing new ones (%d so far)", self.max_connections, self._refused)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: the slot is free again
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:
        # IDLE_TIMEOUT bounds each wait for bytes; this bounds the whole connection, so a client
        # that sends a byte every few seconds cannot keep a slot (32 such clients: no scrape at all).
        cut = threading.Timer(self.deadline, _cut, (request,))
        cut.daemon = True
        cut.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            cut.cancel()
            self._slots.release()

    def handle_error(self, request: object, client_address: object) -> None:
        """A connection that went silent (IDLE_TIMEOUT) or was reset is no news; anything else is
        one line in the log, not a traceback on stderr."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            log.warning("metrics: a connection failed: %s: %s", type(exc).__name__, exc)


def _cut(request: socket.socket) -> None:
    """End a connection that outlived the deadline (its thread then ends on the closed socket)."""
    try:
        request.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Quiet(WSGIRequestHandler):
    """No line on stderr per scrape; a connection that sends no request within IDLE_TIMEOUT is closed."""

    timeout = IDLE_TIMEOUT

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass
