"""Real Azure and GCS APIs on 127.0.0.1 for the object store tests, as tests.s3_server is S3's:
Azurite (Microsoft's storage emulator, from npm: `.ci/run` installs it where `azurite_blob` looks)
and gcp-storage-emulator (a pure-Python GCS JSON API). Writers use each cloud's own client, never
the fsspec library lossguard reads with."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

AZURITE_VERSION = "3.35.0"
AZURITE_HOME = Path.home() / ".cache" / "lossguard" / "azurite"
"""Where `.ci/run` installs Azurite (`npm install --prefix`); LOSSGUARD_AZURITE names another binary."""
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's well-known development account key (devstoreaccount1): a secret as far as output goes."""


class Uploads:
    """What every store's writer offers the tests: `put` one object, a folder's files under a prefix."""

    def bucket(self, name: str) -> str:
        raise NotImplementedError

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        raise NotImplementedError

    def put_many(self, bucket: str, objects: dict[str, bytes | str]) -> None:
        """Uploaded a few at a time, as a team's boxes do (and a local server answers each in a few ms)."""
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda kv: self.put(bucket, *kv), objects.items()))

    def put_tree(self, bucket: str, prefix: str, folder: Path) -> None:
        self.put_many(bucket, {f"{prefix}/{p.relative_to(folder).as_posix()}": p.read_bytes() for p in folder.rglob("*") if p.is_file()})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen | None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def azurite_blob() -> str | None:
    """The azurite-blob binary: LOSSGUARD_AZURITE, where `.ci/run` installs it, or on PATH."""
    for candidate in (os.environ.get("LOSSGUARD_AZURITE"), str(AZURITE_HOME / "node_modules" / ".bin" / "azurite-blob")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("azurite-blob")


class Azure(Uploads):
    def __init__(self, connection: str) -> None:
        from azure.storage.blob import BlobServiceClient

        self.client = BlobServiceClient.from_connection_string(connection)

    def bucket(self, name: str) -> str:
        self.client.create_container(name)
        return name

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client.get_blob_client(bucket, key).upload_blob(body.encode() if isinstance(body, str) else body, overwrite=True)


@contextmanager
def azurite(binary: str, folder: Path) -> Iterator[tuple[Azure, dict[str, str]]]:
    """Azurite's blob service on a free port, and the environment adlfs reads (the dev account's
    connection string, as AZURE_STORAGE_CONNECTION_STRING)."""
    port = _free_port()
    proc = subprocess.Popen([binary, "--silent", "--location", str(folder), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                             "--skipApiVersionCheck", "--loose", "--disableTelemetry"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc)
        connection = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURE_KEY};"
                      f"BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;")
        yield Azure(connection), {"AZURE_STORAGE_CONNECTION_STRING": connection}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Gcs(Uploads):
    def __init__(self) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        self.client = storage.Client(project="lossguard", credentials=AnonymousCredentials())

    def bucket(self, name: str) -> str:
        self.client.create_bucket(name)
        return name

    def put(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client.bucket(bucket).blob(key).upload_from_string(body.encode() if isinstance(body, str) else body)


@contextmanager
def gcs_emulator() -> Iterator[tuple[Gcs, dict[str, str]]]:
    """gcp-storage-emulator in this process (in memory) on a free port, and STORAGE_EMULATOR_HOST,
    which gcsfs and google-cloud-storage both honour."""
    from gcp_storage_emulator.server import create_server

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        _wait_listening(port, None)
        env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # (the writer's client reads it when built)
        try:
            yield Gcs(), env
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        server.stop()
