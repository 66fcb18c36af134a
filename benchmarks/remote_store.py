"""A local S3 store with a delay per request and a bandwidth cap, that counts what it serves.

:func:`moto_store` starts moto's S3 server on 127.0.0.1 (dummy credentials
in this process's environment); :class:`ThrottledProxy` stands in front of it,
one per store configuration (:class:`StoreConfig`), and every client of a
measurement is pointed at the proxy with ``AWS_ENDPOINT_URL``::

    client (s3fs / botocore)  --HTTP/1.1-->  ThrottledProxy  --HTTP/1.1-->  moto
                                             sleeps latency_ms per request,
                                             sends bodies at <= cap_mb_s overall,
                                             counts requests and body bytes

The cap is **overall**: one link shared by every connection (a store or a
NIC with that much bandwidth), not per connection; chunks of 64 KiB take
turns on it. The delay is the time to the first byte of each request
(before it is forwarded). The counts are what clients asked the store for:
requests of every method (listing, HEAD, GET) and the bytes of the response
bodies (object bytes and listings; HEAD answers have no body).
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, NamedTuple

_CHUNK = 64 * 1024
#: hop-by-hop headers and the ones the proxy sets itself
_NOT_FORWARDED = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
                  "content-length"}


@dataclass(frozen=True)
class StoreConfig:
    """One configuration of the store.

    Attributes:
        latency_ms: delay added to every request before it is forwarded, milliseconds (>= 0).
        cap_mb_s: overall bandwidth of the response bodies, MB/s (10^6 bytes); None: no cap.
    """

    latency_ms: float = 0.0
    cap_mb_s: float | None = None

    def __post_init__(self) -> None:
        if self.latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {self.latency_ms}")
        if self.cap_mb_s is not None and not self.cap_mb_s > 0:
            raise ValueError(f"cap_mb_s must be > 0 MB/s (or None: no cap), got {self.cap_mb_s}")

    @property
    def name(self) -> str:
        """E.g. ``"20 ms"`` or ``"20 ms, 20 MB/s"``."""
        return f"{self.latency_ms:g} ms" + ("" if self.cap_mb_s is None else f", {self.cap_mb_s:g} MB/s")


def parse_stores(text: str) -> list[StoreConfig]:
    """``"0,20,50,20@20"`` -> configurations: a latency in ms, optionally ``@`` a cap in MB/s.

    Raises:
        ValueError: an item that is not ``MS`` or ``MS@MBS``, or an empty list.
    """
    stores = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        latency, _, cap = item.partition("@")
        try:
            stores.append(StoreConfig(float(latency), float(cap) if cap else None))
        except ValueError as err:
            raise ValueError(f"--stores: bad item {item!r} ({err}); write LATENCY_MS or LATENCY_MS@CAP_MB_S, "
                             f"e.g. 20 or 20@20") from err
    if not stores:
        raise ValueError(f"--stores: no configuration in {text!r}; e.g. 0,20,50,20@20")
    return stores


class Counts(NamedTuple):
    """What a proxy served: requests (every method), response body bytes, and of the requests the HEADs."""

    requests: int = 0
    body_bytes: int = 0
    heads: int = 0

    def __sub__(self, other: "Counts") -> "Counts":  # type: ignore[override]
        return Counts(*(a - b for a, b in zip(self, other)))


class _Link:
    """The shared link of a capped store: each chunk waits for its turn at ``rate`` bytes/s."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = 0.0

    def send(self, out, data: bytes) -> None:
        if self.rate is None:
            out.write(data)
            return
        for start in range(0, len(data), _CHUNK):
            chunk = data[start:start + _CHUNK]
            with self._lock:
                begin = max(time.monotonic(), self._free_at)
                self._free_at = begin + len(chunk) / self.rate
                done = self._free_at
            time.sleep(max(0.0, done - time.monotonic()))
            out.write(chunk)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect of S3
    server: "_Server"

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def _forward(self) -> None:
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if proxy.config.latency_ms:
            time.sleep(proxy.config.latency_ms / 1000)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_FORWARDED}
        try:
            upstream = getattr(self, "_upstream", None) or http.client.HTTPConnection(*proxy.upstream, timeout=60)
            self._upstream = upstream
            upstream.request(self.command, self.path, body=body, headers=headers)
            answer = upstream.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException) as err:
            self._upstream = None
            self.send_error(502, f"upstream {proxy.upstream}: {err}")
            return
        head = self.command == "HEAD"
        proxy.count(0 if head else len(data), head=head)
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in _NOT_FORWARDED:
                self.send_header(key, value)
        self.send_header("Content-Length", answer.getheader("Content-Length", "0") if head else str(len(data)))
        self.end_headers()
        if not head:
            proxy.link.send(self.wfile, data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: "ThrottledProxy"


class ThrottledProxy:
    """An HTTP proxy in front of ``upstream`` with :class:`StoreConfig`'s delay and cap, counting what it serves.

    Args:
        upstream: the store's ``http://host:port``.
        config: the delay and the cap.

    Use as a context manager, or :meth:`close` it; :attr:`endpoint` is what clients get.
    """

    def __init__(self, upstream: str, config: StoreConfig) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.config = config
        self.link = _Link(None if config.cap_mb_s is None else config.cap_mb_s * 1e6)
        self._lock = threading.Lock()
        self._counts = Counts()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"proxy {config.name}", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def count(self, body_bytes: int, *, head: bool = False) -> None:
        with self._lock:
            self._counts = Counts(self._counts.requests + 1, self._counts.body_bytes + body_bytes,
                                  self._counts.heads + head)

    def counts(self) -> Counts:
        """Requests and body bytes served since the proxy started (subtract two to get an interval's)."""
        with self._lock:
            return self._counts

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "ThrottledProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: the S3 client variables a measurement process needs (dummy keys: moto checks none)
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def client_env(endpoint: str, base: dict | None = None) -> dict:
    """``base`` (default this environment) with the S3 variables and ``AWS_ENDPOINT_URL=endpoint``."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _UNSET}
    return env | S3_ENV | {"AWS_ENDPOINT_URL": endpoint}


@contextlib.contextmanager
def moto_store() -> Iterator[tuple[object, str]]:
    """``(boto3 client, endpoint)`` of moto's S3 server on 127.0.0.1, stopped on exit.

    Raises:
        ImportError: moto or boto3 missing (``pip install -e .[bench]``).
    """
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as err:
        raise ImportError(f"the remote benchmark needs moto's S3 server and boto3 ({err}); "
                          f"pip install -e .[bench]") from err
    quiet = logging.getLogger("werkzeug")  # moto's web server logs every request
    quiet.setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        env = client_env(endpoint)
        client = boto3.client("s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
                              aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        yield client, endpoint
    finally:
        server.stop()


def upload(client, root: Path, bucket: str, *, skip: tuple[str, ...] = (".daliload", "meta.json")) -> int:
    """Every file under ``root`` (but the names in ``skip``) into a new ``bucket``, keyed by its relative path.

    Returns:
        The number of objects written.
    """
    client.create_bucket(Bucket=bucket)
    written = 0
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and not set(relative.parts) & set(skip):
            client.upload_file(str(path), bucket, relative.as_posix())
            written += 1
    return written
