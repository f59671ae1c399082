"""W&B's `.wandb` transaction logs, as the real wandb writes them (offline mode, its wandb-core
service, no network): read back, cut at any byte, damaged, found among W&B's own files, and
followed by a real daemon while a real run writes."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lossguard.ingest.cursor import Cursor
from lossguard.ingest.discover import discover
from lossguard.ingest.reader import ReadOptions, read, read_paths
from lossguard.ingest.sources.wandb_log import BLOCK, frame

from .conftest import run_lossguard, run_lossguard_in_process
from .test_incremental import _grow_and_read
from .test_watch import NO_PLOTS, Watch

pytest.importorskip("wandb")

OPTIONS = ReadOptions()

WRITER = r'''
import sys, wandb
import numpy as np

def hf_like(project, steps, *, name=None, run_id=None, resume=None, spike_at=None, odd=False):
    """Logged as HF's WandbCallback does: train/ keys and the trainer's train/global_step each call."""
    run = wandb.init(project=project, name=name, id=run_id, resume=resume)
    for s in range(1, steps + 1):
        row = {"train/loss": 9.0 if s == spike_at else 2.0 + (s % 5) * 0.01, "train/learning_rate": 1e-4,
               "train/grad_norm": 1.0 + (s % 3) * 0.01, "train/global_step": s * 10}
        if odd and s == 20:
            row["train/loss"] = float("nan")
        if odd and s == 30:
            row["train/grad_norm"] = float("inf")
        if odd and s % 10 == 0:
            row["eval"] = {"acc": s / 1000}
        if odd and s == 15:
            row["weights"] = wandb.Histogram([1.0, 2.0, 3.0])
            row["note"] = "a string"
        if odd and s == 290:  # (W&B objects: dicts tagged with a `_type` whose numbers, width, size, nrows, are no curves)
            row["samples"] = wandb.Image(np.zeros((8, 8, 3), dtype=np.uint8))
            row["preds"] = wandb.Table(columns=["a", "b"], data=[[1, 2]])
        wandb.log(row)
    run.finish()
    return run.id

ids = {}
ids["hf"] = hf_like("huggingface", 300, name="smart-sun-12", spike_at=250, odd=True)
ids["twin"] = hf_like("huggingface", 30, name="smart-sun-12")
ids["resumed"] = hf_like("huggingface", 20, run_id="resume01")
hf_like("huggingface", 20, run_id="resume01", resume="allow")
print(repr(ids))
'''


def wandb_env(folder: Path, home: Path) -> dict[str, str]:
    """An offline wandb writing under `folder` (WANDB_DIR): no network, no prompt, nothing shared
    with another test (its settings, cache and config live in `home`, outside what is scanned)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(folder), WANDB_SILENT="true", WANDB_CONFIG_DIR=str(home / ".config"),
               WANDB_CACHE_DIR=str(home / ".cache"), WANDB_DATA_DIR=str(home / ".data"), HOME=str(home))
    return env


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    """A training box's folder: exp1/ where four runs were logged with wandb (WANDB_DIR=exp1),
    and the ids wandb gave them."""
    root = tmp_path_factory.mktemp("box")
    exp1 = root / "exp1"
    exp1.mkdir()
    done = subprocess.run([sys.executable, "-c", WRITER], env=wandb_env(exp1, tmp_path_factory.mktemp("home")), cwd=exp1, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ids = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 - (the child's own repr of a dict of ids)
    return root, ids


def _file(root: Path, run_id: str) -> Path:
    return next(p for p in sorted((root / "exp1" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")))


def test_a_run_logged_with_wandb_reads_back_every_step_metric_and_nan_where_it_was_logged(box):
    root, ids = box
    path = _file(root, ids["hf"])
    res = read(path, run=".", fmt="wandb", final=True, options=OPTIONS)
    assert res.problems == ()  # (a histogram, an image, a table and a string were logged: passed over quietly)
    frame_ = res.frame
    assert set(frame_.get_column("run").unique()) == {f"huggingface/smart-sun-12@{ids['hf']}"}
    loss = frame_.filter(pl.col("tag") == "train/loss")
    assert loss.get_column("step").to_list() == [s * 10 for s in range(1, 301)]  # the trainer's step, not W&B's _step
    values = dict(zip(loss.get_column("step").to_list(), loss.get_column("value").to_list()))
    assert math.isnan(values[200]) and values[2500] == 9.0 and values[10] == 2.01
    grad = dict(frame_.filter(pl.col("tag") == "train/grad_norm").select("step", "value").iter_rows())
    assert grad[300] == math.inf and len(grad) == 300
    assert frame_.filter(pl.col("tag") == "eval.acc").get_column("step").to_list() == list(range(100, 3001, 100))
    assert set(frame_.get_column("tag").unique()) == {"train/loss", "train/learning_rate", "train/grad_norm", "eval.acc"}
    assert frame_.get_column("wall_time").null_count() == 0  # W&B's _timestamp


def test_two_runs_given_one_name_stay_two_and_a_resumed_run_continues_as_one(box):
    root, ids = box
    frame_, _, problems = read_paths([root])
    assert problems == []
    runs = frame_.group_by("run").agg(pl.col("source").n_unique().alias("files"), pl.len().alias("rows")).sort("run")
    assert runs.rows() == sorted([
        (f"exp1/huggingface/smart-sun-12@{ids['hf']}", 1, 300 * 3 + 30),
        (f"exp1/huggingface/smart-sun-12@{ids['twin']}", 1, 30 * 3),
        ("exp1/huggingface/resume01", 2, 40 * 3),  # (no display name offline: the id)
    ])
    # `scan --run` counts the files of the runs it keeps: the resumed run's two, not the others'.
    from lossguard.detection.rules import default_rules
    from lossguard.report.audit import scan

    kept = scan([root], rules=default_rules(), run_glob="*/resume01")
    assert [r.run for r in kept.runs] == ["exp1/huggingface/resume01"] and kept.files == 2


def test_scan_finds_the_spike_logged_at_its_step_and_read_says_where_the_steps_come_from(box):
    root, ids = box
    res = run_lossguard("scan", str(root), "--format", "json")
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    hf = next(r for r in report["runs"] if r["run"].endswith(ids["hf"]))
    assert [s["step"] for s in hf["spikes"] if s["metric"] == "loss" and s["kind"] != "nonfinite"] == [2500]
    assert hf["format"] == "wandb"
    said = run_lossguard_in_process("read", str(_file(root, ids["twin"])))
    assert said.returncode == 0, said.stderr
    assert f"steps of run-{ids['twin']}.wandb: the trainer's train/global_step" in said.stdout.splitlines()[0]


def _history_byte(data: bytes, after: int) -> int:
    """A byte inside the first history record that starts after `after` in one chunk (wandb's own
    classes tell the records apart): damage there is in a record the reader checksums."""
    from wandb.proto import wandb_internal_pb2

    records = frame(data, base=0, final=True, source="x")
    for at, a, b in zip(records.offsets.tolist(), records.starts.tolist(), records.ends.tolist()):
        whole = at % 32768 + 7 + (b - a) <= 32768
        if at > after and whole and wandb_internal_pb2.Record.FromString(bytes(records.data[a:b])).WhichOneof("record_type") == "history":
            return at + 7 + (b - a) // 2
    raise AssertionError("no history record after the offset")


def _boundaries(data: bytes) -> list[int]:
    """Where each record starts in the file, and a few bytes into it (a record cut mid-way)."""
    records = frame(data, base=0, final=True, source="x")
    starts = records.offsets.tolist()
    return sorted({*starts, *(s + 3 for s in starts), *(s + 11 for s in starts), len(data)})


def test_a_file_cut_at_every_record_boundary_and_inside_records_reads_on_to_the_same_rows(box, tmp_path):
    root, ids = box
    src = _file(root, ids["twin"])
    data = src.read_bytes()
    whole = read(src, run=".", fmt="wandb", final=True, options=OPTIONS)
    target = tmp_path / src.name
    for cut in _boundaries(data):
        target.write_bytes(data[:cut])
        first = read(target, run=".", fmt="wandb", final=False, options=OPTIONS)
        assert first.problems == () and first.cursor.offset <= cut
        target.write_bytes(data)
        rest = read(target, first.cursor, run=".", fmt="wandb", final=True, options=OPTIONS)
        assert rest.problems == ()
        assert pl.concat([first.frame, rest.frame]).drop("source").equals(whole.frame.drop("source")), cut


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.floats(0, 1), max_size=8))
def test_a_growing_file_read_in_pieces_equals_one_read(box, tmp_path_factory, picks):
    root, ids = box
    src = _file(root, ids["hf"])
    data = src.read_bytes()
    whole = read(src, run="r", fmt="wandb", final=True, options=OPTIONS)
    grown, cursor = _grow_and_read(tmp_path_factory.mktemp("grow") / src.name, data, [int(p * len(data)) for p in picks], "wandb")
    assert grown.drop("source").equals(whole.frame.drop("source"))
    assert (cursor.offset, cursor.name, cursor.steps) == (len(data), whole.cursor.name, "train/global_step")


def test_a_limited_read_a_piece_at_a_time_equals_one_read(box):
    root, ids = box
    src = _file(root, ids["hf"])
    whole = read(src, run=".", fmt="wandb", final=True, options=OPTIONS)
    cursor, frames, reads = Cursor(), [], 0
    while cursor.offset < src.stat().st_size:
        res = read(src, cursor, run=".", fmt="wandb", final=False, options=OPTIONS, limit=5000)
        assert res.problems == () and res.cursor.offset > cursor.offset
        frames.append(res.frame)
        cursor, reads = res.cursor, reads + 1
    assert reads > 20 and pl.concat(frames).equals(whole.frame)


def test_a_bad_checksum_in_the_middle_is_one_warning_and_the_blocks_after_it_are_read(box, tmp_path):
    root, ids = box
    src = _file(root, ids["hf"])
    data = bytearray(src.read_bytes())
    assert len(data) > 4 * BLOCK
    records = frame(bytes(data), base=0, final=True, source="x")
    # A byte of a history record (as wandb's own classes tell it) in the third block.
    from wandb.proto.wandb_internal_pb2 import Record

    spans = zip(records.offsets.tolist(), records.starts.tolist(), records.ends.tolist())
    offset, start, end = next(
        (o, s, e) for o, s, e in spans
        if 2 * BLOCK + 100 < o and e - s < 3 * BLOCK - o - 7 and Record.FromString(records.data[s:e].tobytes()).WhichOneof("record_type") == "history"
    )
    at = offset + 7 + (end - start) // 2
    data[at] ^= 0x01
    damaged = tmp_path / src.name
    damaged.write_bytes(bytes(data))
    whole = read(src, run=".", fmt="wandb", final=True, options=OPTIONS).frame
    res = read(damaged, run=".", fmt="wandb", final=True, options=OPTIONS)
    assert len(res.problems) == 1, res.problems
    problem = res.problems[0]
    assert "damaged" in problem.message and 2 * BLOCK <= problem.offset < at <= 3 * BLOCK
    # What is lost is what the rest of that block held (by wandb's own reading of its records);
    # the blocks after it are read.
    held = set()
    for o, s, e in zip(records.offsets.tolist(), records.starts.tolist(), records.ends.tolist()):
        record = Record.FromString(records.data[s:e].tobytes())
        if offset <= o < 3 * BLOCK and record.WhichOneof("record_type") == "history":
            held |= {int(json.loads(i.value_json)) for i in record.history.item if i.nested_key == ["train/global_step"]}
    lost = whole.join(res.frame, on=["step", "tag"], how="anti")
    assert set(lost.get_column("step").to_list()) == held and len(held) > 10
    assert whole.filter(pl.col("step") > max(held)).drop("source").equals(res.frame.filter(pl.col("step") > max(held)).drop("source"))


def test_a_file_that_is_not_a_wandb_log_is_one_problem_and_not_read_again(tmp_path):
    path = tmp_path / "wandb" / "offline-run-20260101_000000-garbage1" / "run-garbage1.wandb"
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(range(256)) * 64)
    res = read(path, run=".", fmt="wandb", final=False, options=OPTIONS)
    assert res.dead and [p.message for p in res.problems] == ["not a W&B transaction log (its first bytes are not ':W&B' and the magic 0xBEE1); not read"]


def test_discovery_takes_the_transaction_logs_and_not_latest_run_or_the_copies_under_files(box, tmp_path):
    root, ids = box
    copy = tmp_path / "box"
    shutil.copytree(root, copy, symlinks=True)
    wandb_dir = copy / "exp1" / "wandb"
    assert (wandb_dir / "latest-run").is_symlink()
    twin = _file(copy, ids["twin"])
    shutil.copy(twin, twin.parent / "files" / twin.name)  # a copy W&B's files/ might hold
    (twin.parent / "logs" / "debug.log").write_text("step 1 loss 2.0\n")
    online = wandb_dir / twin.parent.name.replace("offline-run-", "run-")  # an online run's folder
    shutil.copytree(twin.parent, online)
    found = discover(copy, problems=[])
    offline = sorted(wandb_dir.glob("offline-run-*/run-*.wandb"))
    assert sorted(f.path for f in found) == sorted([*offline, online / twin.name])
    assert {f.run for f in found} == {"exp1"}


def test_a_new_wandb_file_holding_only_its_header_is_not_taken_for_another_run_renamed(tmp_path):
    from lossguard.state import FileRow
    from lossguard.watch.followed import Tracker

    folder = tmp_path / "runs" / "exp" / "wandb"
    first = folder / "offline-run-20260101_000000-aaaa1111" / "run-aaaa1111.wandb"
    first.parent.mkdir(parents=True)
    first.write_bytes(b":W&B\xe1\xbe\x00")  # all wandb-core writes in a run's first 15 s
    tracker = Tracker([tmp_path / "runs"], log=lambda _: None)
    seen, _ = tracker.walk({}, quiet=False)
    rows = {p: FileRow(p, s.row.run, "wandb", s.row.device, s.row.inode, s.row.fingerprint, Cursor(offset=7).to_json(), False, 0) for p, s in seen.items()}
    second = folder / "offline-run-20260101_000100-bbbb2222" / "run-bbbb2222.wandb"
    second.parent.mkdir()
    os.rename(first, second)  # the same inode under another run's name, as a reused inode would be
    seen, _ = tracker.walk(rows, quiet=False)
    assert Cursor.from_json(seen[str(second)].row.cursor).offset == 0  # a new file, read from its start


LIVE = r'''
import sys, time, wandb
# wandb-core writes its log every x_transaction_log_flush_interval seconds (15 by default) or when
# a 32 KiB block fills: 0.5 s here, so the test waits on the daemon, not on W&B.
run = wandb.init(project="huggingface", name="live", settings=wandb.Settings(x_transaction_log_flush_interval=0.5))
print(run.id, flush=True)
for s in range(1, 61):
    wandb.log({"train/loss": 9.0 if s == 45 else 2.0 + (s % 5) * 0.01, "train/learning_rate": 1e-4, "train/grad_norm": 1.0, "train/global_step": s})
    time.sleep(0.05)
sys.stdin.readline()  # (still running until the test has seen the daemon alert what was flushed)
run.finish()
'''


def test_the_daemon_follows_a_run_wandb_is_writing_alerts_its_spike_once_and_not_again_after_kill_9(tmp_path):
    (tmp_path / "runs" / "exp").mkdir(parents=True)
    w = Watch(tmp_path, env=NO_PLOTS).start()
    writer = None
    try:
        w.wait_settled()
        writer = subprocess.Popen([sys.executable, "-c", LIVE], env=wandb_env(tmp_path / "runs" / "exp", tmp_path / "home"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        run_id = writer.stdout.readline().strip()
        run = f"exp/huggingface/live@{run_id}"
        ev = w.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == run for e in ev), timeout=120)
        assert [(e["rule"], e["step"]) for e in ev if e["event"] == "opened" and e["run"] == run] == [("loss-spike", 45)]
        writer.stdin.close()  # (the run finishes now: what was alerted was read while it ran)
        assert writer.wait(timeout=120) == 0
        w.kill9()
        w.start()
        ev = w.settle()
        assert [(e["rule"], e["step"]) for e in ev if e["event"] == "opened" and e["run"] == run] == [("loss-spike", 45)]
    finally:
        if writer is not None and writer.poll() is None:
            writer.kill()
        err = w.stop_and_read()
    assert w.proc.returncode == 0, err


def test_a_project_folder_named_wandb_is_walked_as_any_folder(tmp_path):
    log = tmp_path / "code" / "wandb" / "experiments" / "exp1" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"step {s} loss {2.0 + (s % 3) * 0.01}\n" for s in range(1, 30)))
    assert [(f.run, f.path) for f in discover(tmp_path / "code", problems=[])] == [("wandb/experiments/exp1", log)]


@settings(max_examples=200)
@given(messages=st.lists(st.binary(max_size=40), min_size=1, max_size=30), keep=st.sets(st.integers(1, 20), max_size=4), stop=st.sets(st.integers(1, 20), max_size=3))
def test_the_field_walker_finds_for_many_messages_at_once_what_it_finds_one_by_one(messages, keep, stop):
    """Messages walked as arrays (many at once) and one by one (a daemon's few new records) give the
    same fields, broken bytes included."""
    import numpy as np

    from lossguard.ingest.sources import protobuf

    raw = b"".join(messages)
    data = np.frombuffer(raw + bytes(16), dtype=np.uint8)
    ends = np.cumsum([len(m) for m in messages])
    starts = ends - [len(m) for m in messages]
    many = protobuf.fields(data, np.repeat(starts, protobuf.FEW + 1), np.repeat(ends, protobuf.FEW + 1), keep=keep, stop=stop)
    few = protobuf._fields_one_by_one(data, np.repeat(starts, protobuf.FEW + 1), np.repeat(ends, protobuf.FEW + 1), keep=frozenset(keep), stop=frozenset(stop))

    def rows(f):
        return sorted(zip(f.message.tolist(), f.key_at.tolist(), f.number.tolist(), f.wire.tolist(), f.start.tolist(), f.end.tolist(), f.value.tolist()))

    assert rows(many) == rows(few)
    assert many.bad.tolist() == few.bad.tolist()


def test_history_read_before_any_run_record_is_named_for_the_run_id_in_the_file_name(box, tmp_path):
    from wandb.proto.wandb_internal_pb2 import Record

    root, ids = box
    src = _file(root, ids["hf"])
    data = bytearray(src.read_bytes())
    records = frame(bytes(data), base=0, final=True, source="x")
    spans = zip(records.offsets.tolist(), records.starts.tolist(), records.ends.tolist())
    offset = next(o for o, s, e in spans if Record.FromString(records.data[s:e].tobytes()).WhichOneof("record_type") == "run")
    data[offset + 20] ^= 0x01  # the RunRecord's checksum fails: its block is skipped
    damaged = tmp_path / src.name
    damaged.write_bytes(bytes(data))
    res = read(damaged, run="exp1", fmt="wandb", final=True, options=OPTIONS)
    assert [p.offset for p in res.problems][:1] == [offset] and "named for the file's run id" in res.problems[1].message
    assert set(res.frame.get_column("run").unique()) == {f"exp1/{ids['hf']}"}
    assert res.frame.get_column("step").min() > 10 and res.frame.get_column("step").max() == 3000


def test_many_growing_files_read_together_give_what_each_read_alone_gives(box, tmp_path):
    """A daemon's pass reads the few new records of many runs in one decode (readmany): each file's
    rows, cursor and span are those its own read gives, at every stage of growth, a cut record
    included; a file with damage in its new bytes is left to its own read, which warns of it."""
    from lossguard.detection.engine import SCAN_NEEDS
    from lossguard.ingest import readmany

    root, ids = box
    sources = [_file(root, ids[k]) for k in ("hf", "twin", "resumed")]
    datas = [s.read_bytes() for s in sources]
    targets = [tmp_path / f"{i}" / s.name for i, s in enumerate(sources)]
    for t in targets:
        t.parent.mkdir()
    targets.append(tmp_path / "damaged" / sources[0].name)
    targets[-1].parent.mkdir()
    datas.append(datas[0])
    cursors = [Cursor()] * len(targets)
    batched = 0
    for stage in range(1, 41):
        for i, (t, d) in enumerate(zip(targets, datas)):
            grown = bytearray(d[: len(d) * stage // 40 + (stage * 37) % 11])  # (cut anywhere: inside records too)
            if i == len(targets) - 1 and stage == 20:
                grown[_history_byte(d, cursors[i].offset)] ^= 0x01  # (in what this stage adds)
            t.write_bytes(bytes(grown))
        jobs = [readmany.Job(t, c, f"run{i}", "wandb", limit=None if i % 2 else 3000) for i, (t, c) in enumerate(zip(targets, cursors))]
        together = readmany.read_many(jobs, options=OPTIONS, needs=SCAN_NEEDS)
        alone = [read(j.path, j.cursor, run=j.run, fmt="wandb", final=False, options=OPTIONS, limit=j.limit, needs=SCAN_NEEDS) for j in jobs]
        for i, (t, a) in enumerate(zip(together, alone)):
            if t is None:
                assert stage == 1 or a.problems or i == len(targets) - 1, (stage, i)
                continue
            batched += 1
            assert t.frame.equals(a.frame), (stage, i)
            assert (t.cursor, t.span, t.named, t.problems) == (a.cursor, a.span, a.named, ()), (stage, i)
        cursors = [a.cursor for a in alone]
        if stage == 20:
            assert any("damaged" in p.message for p in alone[-1].problems)
    assert batched > 100


@settings(max_examples=100)
@given(keys=st.lists(st.binary(max_size=40), min_size=1, max_size=40), extra=st.integers(0, 600), seed=st.integers(0, 2**32 - 1))
def test_keys_told_apart_as_arrays_are_the_distinct_byte_strings(keys, extra, seed):
    """_distinct gives each item the index of its exact bytes among the distinct ones, keys of any
    length (the long ones compared whole), and many distinct keys sharing hash slots."""
    import numpy as np

    from lossguard.ingest.formats.wandb_items import _distinct
    from lossguard.ingest.sources.wandb_log import PAD

    rng = np.random.default_rng(seed)
    pool = keys + [rng.bytes(int(n)) for n in rng.integers(0, 30, extra)]
    items = [pool[i] for i in rng.integers(0, len(pool), 3 * len(pool))]
    raw = bytes(PAD) + b"".join(items) + bytes(PAD)
    lengths = np.array([len(k) for k in items])
    starts = PAD + np.cumsum(lengths) - lengths
    found, codes = _distinct(np.frombuffer(raw, dtype=np.uint8), starts, starts + lengths)
    assert [found[c] for c in codes.tolist()] == items
    assert len(set(found)) == len(found) == len(set(items))


@settings(max_examples=200)
@given(records=st.lists(st.binary(max_size=12), min_size=1, max_size=40))
def test_the_records_the_reader_needs_are_told_from_their_first_bytes_as_a_varint_walk_tells_them(records):
    """_read_here, from each record's first 8 bytes, against the field walk it stands for: `num` a
    varint, then the kind's key (history, or control before a RunRecord)."""
    import numpy as np

    from lossguard.ingest.formats.wandb import _read_here
    from lossguard.ingest.sources.protobuf import varints
    from lossguard.ingest.sources.wandb_log import PAD

    # Nothing after the last record: the buffer _checksums hands over ends with it (a 5-byte exit
    # record there was read 3 bytes past the buffer, and the whole file was lost).
    raw = bytes(PAD) + b"".join(records)
    data = np.frombuffer(raw, dtype=np.uint8)
    padded = np.frombuffer(raw + bytes(PAD), dtype=np.uint8)
    lengths = np.array([len(r) for r in records])
    starts = PAD + np.cumsum(lengths) - lengths
    ends = starts + lengths
    _, after, bad = varints(padded, starts + 1, ends)
    kind, then = padded[after], padded[after + 1]
    ours = (kind == 0x12) | (((kind == 0x8A) | (kind == 0x82)) & (then == 0x01))
    longer = after - starts > 6  # (a num longer than 5 bytes: needed, whatever follows)
    expected = (padded[starts] != 0x08) | bad | ours | longer
    assert _read_here(data, starts, ends).tolist() == expected.tolist()


@settings(max_examples=100)
@given(raw=st.binary(min_size=0, max_size=200), lead=st.integers(0, 7))
def test_words_gathered_at_any_byte_are_the_bytes_there(raw, lead):
    import numpy as np

    from lossguard.ingest.sources.tfrecord import rows_at, words_at

    arr = np.frombuffer(bytes(lead) + raw + bytes(16), dtype=np.uint8)[lead:]
    at = np.arange(0, max(0, arr.size - 16))
    assert words_at(arr, at).tolist() == rows_at(arr, at, 8).view("<u8").ravel().tolist()


def test_a_killed_runs_cut_last_record_is_a_warning_of_that_run_not_of_no_run(box, tmp_path):
    """Acceptance run 2: a run killed (-9) mid-write said its cut record among the files of no run
    (the report's top-level warnings), where nobody looking at the run would see it."""
    root, ids = box
    src = _file(root, ids["twin"])
    copy = tmp_path / "wandb" / src.parent.name / src.name
    copy.parent.mkdir(parents=True)
    data = src.read_bytes()
    cut = max(b for b in _boundaries(data) if b < len(data) - 60) + 20  # (inside its last records)
    copy.write_bytes(data[:cut])
    res = run_lossguard("scan", str(tmp_path), "--format", "json")
    report = json.loads(res.stdout)
    (run,) = report["runs"]
    assert run["run"].endswith(ids["twin"]) and report["warnings"] == []
    assert [w["message"].split(" (")[0] for w in run["warnings"]] == ["last record is incomplete"]


def test_status_names_a_followed_wandb_log_by_its_run_not_by_the_folder_prefix(box, tmp_path, capsys):
    from lossguard.cli import main
    from lossguard.detection.rules import default_rules
    from lossguard.state import State
    from lossguard.watch.follow import Follower

    from .conftest import WAIT_FOR_EVERY_READ

    root, ids = box
    exp1 = tmp_path / "exp1"
    shutil.copytree(root / "exp1" / "wandb", exp1 / "wandb", symlinks=True)
    state = State(tmp_path / "state")
    Follower([exp1], rules=default_rules(), state=state, log=lambda _: None, pass_budget=WAIT_FOR_EVERY_READ).run_pass(1.0)
    state.close()
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out.splitlines()
    path = next((exp1 / "wandb").glob(f"offline-run-*-{ids['hf']}/run-{ids['hf']}.wandb"))
    (line,) = [x for x in out if str(path) in x]
    expected = {r for r in read_paths([exp1])[0].get_column("run").unique().to_list() if r.endswith(ids["hf"])}
    assert {line.split()[0]} == expected and not line.startswith("  . "), line


UNFINISHED = r'''
import wandb
wandb.init(project="smoke", name="unfinished")
for s in range(20):
    wandb.log({"loss": 2.0 + s / 100}, step=s)
# No run.finish(): wandb finishes the run at the interpreter's exit, as for most short scripts
# and for every script that raises (a CUDA OOM), with an exit record a few bytes long.
'''


def test_a_run_wandb_finishes_at_the_scripts_exit_reads_back_every_step(tmp_path):
    # The exit record, 5 bytes at the file's end, was read 8 bytes at a time past the buffer: the
    # whole file "cannot be read", `read` and `scan` said nothing readable.
    done = subprocess.run([sys.executable, "-c", UNFINISHED], env=wandb_env(tmp_path / "exp", tmp_path / "home"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (tmp_path / "exp" / "wandb").glob("offline-run-*/run-*.wandb")
    res = read(path, run="r", fmt="wandb", final=True, options=OPTIONS)
    assert res.problems == ()
    assert res.frame.select("step", "value").rows() == [(s, 2.0 + s / 100) for s in range(20)]


def test_wandb_latest_run_named_on_the_command_line_reads_the_run_it_points_to(box):
    # Passed over by a walk (the run is walked where it is), it read nothing, in silence, when named.
    root, ids = box
    link = root / "exp1" / "wandb" / "latest-run"
    target = Path(os.path.realpath(link))
    res = run_lossguard("read", str(link), "--format", "csv")
    assert res.returncode == 0, res.stderr
    assert res.stdout == run_lossguard_in_process("read", str(target), "--format", "csv").stdout and res.stdout.count("\n") > 10


@contextmanager
def daemon(tmp_path: Path) -> Iterator[Watch]:
    """A real daemon following tmp_path/runs, stopped at the end, which it must reach cleanly."""
    w = Watch(tmp_path, env=NO_PLOTS).start()
    try:
        yield w
    finally:
        err = w.stop_and_read()
    assert w.proc.returncode == 0, err


def again_after_kill_9(w: Watch) -> list[dict]:
    """The deliveries once the daemon, killed -9, is started again and has said all it had to."""
    w.kill9()
    w.start()
    return w.settle()


RESUMED = r'''
import sys, wandb

def log(steps, spikes, resume=None):
    run = wandb.init(project="huggingface", id="resumed7", resume=resume)
    for s in steps:
        wandb.log({"train/loss": 9.0 if s in spikes else 2.0 + (s % 5) * 0.01, "train/global_step": s})
    run.finish()

if sys.argv[1] == "first":
    log(range(1, 121), {60, 100})
else:  # resumed by id: the same 120 steps logged again, value for value, then 60 more
    log(range(1, 181), {60, 100, 150}, resume="allow")
'''


def test_a_run_resumed_by_id_that_logs_its_history_again_is_one_timeline_the_daemon_alerting_what_scan_reports_once(tmp_path):
    exp = tmp_path / "runs" / "exp"
    exp.mkdir(parents=True)

    def write(part: str) -> None:
        done = subprocess.run([sys.executable, "-c", RESUMED, part], env=wandb_env(exp, tmp_path / "home"), cwd=exp, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    run = "exp/huggingface/resumed7"
    with daemon(tmp_path) as w:
        w.wait_settled()
        write("first")
        w.wait_for(lambda ev: sum(e["event"] == "opened" for e in ev) >= 2)
        write("resumed")
        assert len(list((exp / "wandb").glob("offline-run-*-resumed7*/run-resumed7.wandb"))) == 2
        w.wait_for(lambda ev: any(e["event"] == "opened" and e["step"] == 150 for e in ev))
        ev = again_after_kill_9(w)
    opened = [(e["run"], e["rule"], e["step"]) for e in ev if e["event"] == "opened"]
    report = json.loads(run_lossguard_in_process("scan", str(tmp_path / "runs"), "--format", "json").stdout)
    (mine,) = [r for r in report["runs"] if r["run"] == run]
    assert mine["steps"] == 180  # (the replay is the history the run held, not a second timeline of it)
    assert [(run, s["rule"], s["step"]) for s in mine["spikes"]] == opened == [(run, "loss-spike", 60), (run, "loss-spike", 100), (run, "loss-spike", 150)]
