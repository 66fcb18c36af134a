"""An S3 server (moto's) on 127.0.0.1 for a test module, and a manifest of local files turned into one of URIs.

The S3 variables (dummy keys, ``AWS_ENDPOINT_URL``) are set while the server
runs; multiprocessing's forkserver is stopped before and after, so that the
workers (the fallback's, the cutter's) start from a forkserver that has them,
and later tests from one that does not.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.forkserver
import shutil
import sqlite3
from pathlib import Path

import pytest

from daliload.prescreen.manifest import Manifest
from daliload.stream import _remote


def _stop_forkserver() -> None:
    multiprocessing.forkserver._forkserver._stop()


@contextlib.contextmanager
def s3_server():
    """``(boto3 client, endpoint URL)`` of a moto S3 server on 127.0.0.1, with the client's variables set."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    quiet = logging.getLogger("werkzeug")  # moto's web server logs every request
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        with pytest.MonkeyPatch.context() as env:
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
                env.delenv(name, raising=False)
            env.setenv("AWS_ACCESS_KEY_ID", "testing")
            env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            env.setenv("AWS_DEFAULT_REGION", "us-east-1")
            env.setenv("AWS_ENDPOINT_URL", endpoint)
            _stop_forkserver()
            _remote._filesystems.clear()
            try:
                yield boto3.client("s3"), endpoint
            finally:
                _stop_forkserver()
                _remote._filesystems.clear()
    finally:
        server.stop()
        quiet.setLevel(level)


def upload(client, root: Path, bucket: str) -> list[str]:
    """Every file under ``root`` (but its ``.daliload``) into a new ``bucket``, keyed by its path under ``root``."""
    client.create_bucket(Bucket=bucket)
    keys = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and ".daliload" not in path.parts:
            key = path.relative_to(root).as_posix()
            client.upload_file(str(path), bucket, key)
            keys.append(key)
    return keys


def uri_manifest(manifest: Path, root: Path, prefix: str, out: Path) -> Path:
    """A copy of ``manifest`` whose paths under ``root`` start with ``prefix`` instead (a URI)."""
    shutil.copy(manifest, out)
    old = str(root.resolve()) + "/"
    with sqlite3.connect(out) as conn:
        for table in ("files", "routes", "byte_index"):
            conn.execute(f"UPDATE {table} SET path = ? || substr(path, ?) WHERE substr(path, 1, ?) = ?",
                         (prefix, len(old) + 1, len(old), old))
    conn.close()
    with Manifest(out, writable=True) as writable:
        writable.store_video_index()  # the stored columns hold the paths too
    return out
