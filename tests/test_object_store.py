"""Runs on object storage: `scan s3://bucket/prefix` and `watch` with such a URL, against a real S3
API on 127.0.0.1 (moto's server, through the real s3fs), with a proxy in front of it counting what
lossguard asks and answering 503 SlowDown when told to (tests.s3_server)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import pytest

from lossguard.cli import main

from .s3_server import SECRET, S3Proxy
from .store_servers import AZURE_KEY, Uploads, azurite, azurite_blob, gcs_emulator
from .test_hf_checkpoints import _checkpoint
from .test_watch import NO_PLOTS, Watch, _calm, _line

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


class Store(Uploads):
    """The server, the proxy lossguard talks to, and a boto3 client that writes to moto directly."""

    def __init__(self, proxy: S3Proxy, client) -> None:  # noqa: ANN001
        self.proxy, self.client = proxy, client

    def bucket(self, name: str) -> str:
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body.encode() if isinstance(body, str) else body)


@pytest.fixture(scope="module")
def s3():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = S3Proxy((host, port))
    env = {"AWS_ACCESS_KEY_ID": "lgtestkeyid", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": proxy.url}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        for key in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(key, raising=False)
        import boto3

        client = boto3.client("s3", endpoint_url=f"http://{host}:{port}")
        yield Store(proxy, client)
    proxy.close()
    server.stop()


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    """Azurite's blob service, and adlfs pointed at it through AZURE_STORAGE_CONNECTION_STRING."""
    pytest.importorskip("adlfs")
    binary = azurite_blob()
    if binary is None:
        pytest.skip("azurite-blob is not installed (.ci/run installs it: npm install --prefix ~/.cache/lossguard/azurite azurite)")
    with azurite(binary, tmp_path_factory.mktemp("azurite")) as (store, env), pytest.MonkeyPatch.context() as mp:
        for key in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ANON"):
            mp.delenv(key, raising=False)
        for key, value in env.items():
            mp.setenv(key, value)
        yield store


@pytest.fixture(scope="module")
def gcs():
    """A GCS JSON API on 127.0.0.1 (gcp-storage-emulator), gcsfs pointed at it by STORAGE_EMULATOR_HOST."""
    pytest.importorskip("gcsfs")
    pytest.importorskip("gcp_storage_emulator")
    with gcs_emulator() as (store, env), pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield store


@pytest.fixture(scope="module")
def several_formats(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("formats") / "runs"
    _runs_of_several_formats(root)
    return root


def _runs_of_several_formats(root: Path) -> None:
    """Runs as their writers lay them out: JSON lines, CSV, TensorBoard (tensorboardX), a HF Trainer's
    checkpoints, a console log; each with a loss spike, and one folder of two runs."""
    from tensorboardX import SummaryWriter

    (root / "jsonl").mkdir(parents=True)
    (root / "jsonl" / "metrics.jsonl").write_text(_calm(range(1, 60)) + _line(60, 9.0) + _calm(range(61, 80)))
    (root / "csv").mkdir()
    (root / "csv" / "metrics.csv").write_text("step,loss\n" + "".join(f"{s},{9.0 if s == 50 else 2.0 + (s % 3) * 0.01}\n" for s in range(1, 90)))
    with SummaryWriter(str(root / "tb" / "version_0")) as writer:
        for step in range(1, 80):
            writer.add_scalar("train/loss", 9.0 if step == 40 else 2.0 + 0.01 * math.sin(step), step)
    _checkpoint(root / "hf", 100, spike=30)
    (root / "console").mkdir()
    (root / "console" / "train.log").write_text("".join(f"step {s} | loss {9.0 if s == 45 else 2.0 + (s % 4) * 0.01:.4f} | lr 1e-4\n" for s in range(1, 70)))
    (root / "two" / "a").mkdir(parents=True)
    (root / "two" / "a" / "metrics.jsonl").write_text(_calm(range(1, 40)))
    (root / "two" / "b.jsonl").write_text(_calm(range(1, 40)))


def _scan_json(capsys, *args: str) -> tuple[int, str]:
    """A scan's exit code and JSON report; no store's secret in what it printed."""
    capsys.readouterr()
    code = main(["scan", *args, "--format", "json", "--quiet"])
    said = capsys.readouterr()
    assert all(secret not in said.out + said.err for secret in (SECRET, AZURE_KEY))
    return code, said.out


@pytest.mark.parametrize("scheme, server", [
    pytest.param("s3", "s3", id="s3"),
    pytest.param("az", "azure", id="azure"),
    pytest.param("abfs", "azure", id="abfs"),
    pytest.param("gs", "gcs", id="gcs"),
])
def test_a_prefix_scans_as_the_same_files_on_disk_named_by_their_urls(scheme, server, several_formats, request, capsys):
    store = request.getfixturevalue(server)
    root = several_formats
    bucket = store.bucket(f"lg-scan-{scheme}")
    store.put_tree(bucket, "team/runs", root)
    disk_code, disk = _scan_json(capsys, str(root))
    url_code, remote = _scan_json(capsys, f"{scheme}://{bucket}/team/runs/")
    assert url_code == disk_code == 1
    report = json.loads(remote)
    assert sorted(r["run"] for r in report["runs"]) == ["console", "csv", "hf", "jsonl", "tb/version_0", "two/a", "two/b"]
    assert [r["run"] for r in report["runs"] if r["spikes"]] == ["console", "csv", "hf", "jsonl", "tb/version_0"]
    assert "lossguard-mirror" not in remote  # (no path of the private copy is shown)
    assert json.loads(disk.replace(str(root), f"{scheme}://{bucket}/team/runs")) == report
    if scheme != "s3":
        return
    # One object named, and the prefix among other roots: named as the same file or folder on disk.
    _, one = _scan_json(capsys, f"s3://{bucket}/team/runs/console/train.log")
    assert [r["run"] for r in json.loads(one)["runs"]] == ["train"]
    _, both = _scan_json(capsys, f"s3://{bucket}/team/runs/two", str(root / "csv"))
    assert sorted(r["run"] for r in json.loads(both)["runs"]) == ["csv", "two/a", "two/b"]
    from lossguard import api

    assert [r["source"] for r in api.scan(f"s3://{bucket}/team/runs/two").runs] == [f"s3://{bucket}/team/runs/two/a/metrics.jsonl",
                                                                                     f"s3://{bucket}/team/runs/two/b.jsonl"]


def test_a_mirror_fetches_only_what_changed_and_an_idle_prefix_costs_its_listing(tmp_path, s3):
    from lossguard.ingest.sources.object_store import Mirror

    bucket = s3.bucket("lg-mirror")
    s3.put_many(bucket, {f"idle/run{i:03d}/metrics.jsonl": _calm(range(1, 20)) for i in range(20)})  # (100: the daemon's test)
    growing = _calm(range(1, 2000))  # (above WHOLE_BELOW: a smaller copy is fetched whole, in one request)
    s3.put(bucket, "idle/live/metrics.jsonl", growing)
    mirror = Mirror(f"s3://{bucket}/idle", cache=tmp_path / "cache", jobs=8)
    first = mirror.sync()
    assert first.fetched == 21 and not first.failed
    copy = mirror.local() / "live" / "metrics.jsonl"
    inode = copy.stat().st_ino

    s3.proxy.reset()
    assert mirror.sync().bytes == 0
    assert sum(s3.proxy.counts.values()) == 1, s3.proxy.lines  # the listing, and no request per object

    s3.proxy.reset()
    s3.put(bucket, "idle/live/metrics.jsonl", growing + _line(2000, 2.0))  # (uploaded whole again, grown)
    grown = mirror.sync()
    assert (grown.appended, grown.rewritten, grown.fetched) == (1, 0, 0)
    assert grown.bytes < 300  # its new line, its head and the few bytes before its end, not the object
    assert sum(s3.proxy.counts.values()) == 3  # the listing and two ranged GETs (the head, the growth)
    assert copy.read_text() == growing + _line(2000, 2.0) and copy.stat().st_ino == inode

    s3.put(bucket, "idle/live/metrics.jsonl", _line(1, 5.0) + growing[len(_line(1, 2.0)):] + _line(2000, 2.0) + _line(2001, 2.0))
    again = mirror.sync()  # earlier bytes changed: fetched whole, the copy rewritten in place
    assert again.rewritten == 1 and copy.read_text().startswith(_line(1, 5.0)) and copy.stat().st_ino == inode
    s3.put(bucket, "idle/live/metrics.jsonl", _line(1, 2.0))
    assert mirror.sync().rewritten == 1 and copy.read_text() == _line(1, 2.0)  # shrank: rewritten too

    s3.client.delete_object(Bucket=bucket, Key="idle/run000/metrics.jsonl")
    s3.put(bucket, "idle/run001/metrics.jsonl/oops", "x")  # (a key below another key: no file a folder can hold)
    changed = mirror.sync()
    assert changed.removed == 1 and not (mirror.local() / "run000" / "metrics.jsonl").exists()
    assert changed.skipped == [f"s3://{bucket}/idle/run001/metrics.jsonl/oops"]
    assert (mirror.local() / "run001" / "metrics.jsonl").is_file()

    # A new mirror of the same folder (a restart) fetches nothing it already holds.
    s3.proxy.reset()
    assert Mirror(f"s3://{bucket}/idle", cache=tmp_path / "cache").sync().bytes == 0
    assert sum(s3.proxy.counts.values()) == 1


def test_a_large_object_is_fetched_in_pieces_and_a_fetch_cut_short_goes_on_from_where_it_stopped(tmp_path, s3, monkeypatch):
    from lossguard.ingest.sources import object_store

    monkeypatch.setattr(object_store, "CHUNK", 4096)  # (as 8 MiB pieces of a large event file, at a test's scale)
    monkeypatch.setattr(object_store, "BATCH_BYTES", 16384)
    bucket = s3.bucket("lg-pieces")
    body = _calm(range(1, 1500))
    s3.put(bucket, "big/train.jsonl", body)
    mirror = object_store.Mirror(f"s3://{bucket}/big", cache=tmp_path / "cache", jobs=4, retries=1)
    s3.proxy.reset()
    assert mirror.sync().fetched == 1
    copy = mirror.local() / "train.jsonl"
    assert copy.read_text() == body and s3.proxy.counts["GET"] == 1 + -(-len(body) // 4096)
    inode = copy.stat().st_ino

    grown = body + _calm(range(1500, 2500))
    s3.put(bucket, "big/train.jsonl", grown)
    s3.proxy.fail(50, after=6)  # (the listing, the first batch: the head and four pieces; then the store fails)
    cut = mirror.sync()
    assert cut.failed and cut.appended == 0
    assert grown.startswith(copy.read_text()) and len(copy.read_text()) > len(body)  # a prefix: a file still being written
    s3.proxy.fail(0)
    done = mirror.sync()
    assert done.appended == 1 and not done.failed
    assert copy.read_text() == grown and copy.stat().st_ino == inode


@pytest.mark.parametrize("url, extra", [
    pytest.param("gs://bucket/runs", "gcs", id="gcs"),
    pytest.param("az://container/runs", "azure", id="azure"),
    pytest.param("abfs://container/runs", "azure", id="abfs"),
])
def test_a_url_whose_extra_is_not_installed_is_one_line_naming_it(url, extra, tmp_path, capsys, monkeypatch):
    pytest.importorskip("fsspec")
    # The store's library made absent, as on a machine without the extra: its import fails.
    package, protocol = {"gcs": ("gcsfs", "gcs"), "azure": ("adlfs", "abfs")}[extra]
    monkeypatch.setitem(sys.modules, package, None)
    for name in (protocol, "gs", "az", "abfs", "abfss"):
        monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, name, raising=False)  # (a class imported before, forgotten)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setattr("lossguard.watch.daemon.setup_logging", lambda level: None)  # (the test's logging stays the test's)
    for command in (["scan", url], ["watch", url, "--state-dir", str(tmp_path / "state")]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pip install 'lossguard[{extra}]'" in err[0], (command, err)


def test_a_store_that_refuses_is_one_line_naming_the_url_and_no_secret(s3, capsys):
    assert main(["scan", "s3://lg-no-such-bucket/runs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s3://lg-no-such-bucket/runs" in err[0] and "no such bucket" in err[0], err
    assert SECRET not in err[0]


def test_the_daemon_follows_a_prefix_alerts_once_through_503s_and_kill_9_and_idles_on_listings(tmp_path, s3, capsys):
    bucket = s3.bucket("lg-live")
    s3.put_many(bucket, {f"team/idle{i:03d}/metrics.jsonl": _calm(range(1, 20)) for i in range(100)})
    history = _calm(range(1, 50)) + _line(50, 9.0) + _calm(range(51, 100))  # (a spike of the past: never alerted)
    s3.put(bucket, "team/exp/metrics.jsonl", history)
    url = f"s3://{bucket}/team"
    w = Watch(tmp_path, env={**NO_PLOTS, **{k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY")}})
    w.args[w.args.index(str(tmp_path / "runs"))] = url
    # The store is down at the daemon's very first start, and still down after a kill -9: what its
    # first complete listing brings is its history, read quietly, as a first start reads a folder.
    s3.proxy.fail(10**6)
    w.start()
    try:
        w.wait_logged("SlowDown")
        w.wait_settled()
        w.kill9()
        w.start()
        w.wait_logged("SlowDown")
        s3.proxy.fail(0)
        w.wait_logged(f"{url}: listed whole for the first time since the first start: what it holds was read as history, not alerted")
        w.wait_ready(files=101)
        # Idle: a poll every 0.2 s costs the listing (one ListObjectsV2 page: 101 keys), no GET per object.
        s3.proxy.reset()
        time.sleep(1.5)
        lists = sum(1 for line in s3.proxy.lines if "list-type=2" in line)
        assert lists >= 3 and len(s3.proxy.lines) == lists, s3.proxy.lines

        # The object rewritten whole as it grows: the spike is alerted, named by its URL.
        history += _line(100, 9.0) + _calm(range(101, 105))
        s3.put(bucket, "team/exp/metrics.jsonl", history)
        ev = w.wait_for(lambda ev: any(e["event"] == "opened" and e["step"] == 100 for e in ev))
        assert [e["source"] for e in ev if e["event"] == "opened"] == [f"{url}/exp/metrics.jsonl"]

        # The store throttles for a while: said once, backed off, and the spike written meanwhile alerted.
        s3.proxy.fail(3)
        w.wait_logged("SlowDown", times=2)
        history += _calm(range(105, 140)) + _line(140, 9.0) + _calm(range(141, 145))
        s3.put(bucket, "team/exp/metrics.jsonl", history)
        w.wait_for(lambda ev: any(e["event"] == "opened" and e["step"] == 140 for e in ev))
        out = w.wait_logged("the store answers again", times=2)
        assert out.count("SlowDown") == 2 and s3.proxy.failed == 3  # (once a spell of failures)
        w.kill9()

        # Grown while the daemon was down; a restart fetches only that object and alerts nothing twice.
        history += _calm(range(145, 160))
        s3.put(bucket, "team/exp/metrics.jsonl", history)
        s3.proxy.reset()
        w.start()
        s3.put(bucket, "team/zz/metrics.jsonl", _calm(range(1, 30)))
        w.wait_logged("following")
        w.wait_ready()
        s3.put(bucket, "team/zz/metrics.jsonl", _calm(range(1, 30)) + _line(30, 9.0))
        ev = w.wait_for(lambda ev: any(e["event"] == "opened" and e["run"] == "zz" for e in ev))
        fetched = {line.split("?")[0] for line in s3.proxy.lines if "list-type=2" not in line}
        assert fetched == {f"GET /{bucket}/team/exp/metrics.jsonl", f"GET /{bucket}/team/zz/metrics.jsonl"}, fetched
    finally:
        out = w.stop_and_read()
    assert sorted((e["run"], e["step"]) for e in ev if e["event"] == "opened") == [("exp", 100), ("exp", 140), ("zz", 30)]
    assert SECRET not in out and SECRET not in w.out.read_text()
    assert "lossguard-mirror" not in out and str(tmp_path / "state") not in out, out
    # `lossguard status` shows the followed copies as their objects' URLs too.
    capsys.readouterr()
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    status = capsys.readouterr().out
    assert f"{url}/exp/metrics.jsonl" in status and str(tmp_path) not in status, status


def test_a_store_error_loses_a_presigned_urls_query_and_the_secrets_the_environment_holds(monkeypatch):
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    from lossguard.ingest.sources.object_store import _translate

    monkeypatch.setenv("AWS_SESSION_TOKEN", "lg-session-token-0123456789")
    said = ("Access Denied for https://lg.s3.amazonaws.com/runs/a?X-Amz-Credential=AKIA%2F20261206&X-Amz-Signature=deadbeef0123"
            " (token lg-session-token-0123456789)")
    boto = ClientError({"Error": {"Code": "AccessDenied", "Message": said}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")
    err = _translate(translate_boto_error(boto), "s3://lg/runs")
    text = str(err)
    assert text.startswith("s3://lg/runs: access denied (403 AccessDenied: ") and not err.transient
    assert "deadbeef" not in text and "AKIA" not in text and "lg-session-token" not in text
    assert "https://lg.s3.amazonaws.com/runs/a?" in text  # (where it was, without what grants access)
    slow = ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                        "ResponseMetadata": {"HTTPStatusCode": 503}}, "ListObjectsV2")
    assert _translate(translate_boto_error(slow), "s3://lg/runs").transient
    throttled = ClientError({"Error": {"Code": "TooManyRequests", "Message": "Rate exceeded"},
                             "ResponseMetadata": {"HTTPStatusCode": 429}}, "ListObjectsV2")
    assert _translate(translate_boto_error(throttled), "s3://lg/runs").transient


def test_paths_from_the_environment_keep_a_urls_scheme(monkeypatch):
    from lossguard.watch.settings import load_settings

    monkeypatch.setenv("LOSSGUARD_PATHS", "s3://lg/runs:/data/runs:gs://lg-b/p/")
    assert load_settings(None).paths == ["s3://lg/runs", Path("/data/runs"), "gs://lg-b/p/"]
