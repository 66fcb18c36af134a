"""A tiny HTTP server with Range support and injected faults, on 127.0.0.1, for tests of remote reads.

Python's ``http.server`` ignores ``Range``; this one answers ``bytes=a-b``,
``bytes=a-`` and ``bytes=-n`` with 206 and the slice, ``HEAD`` with the size.
Faults, per file name (the URL path's last part), set on the running server:

    server.fail["a.webm"] = 2        # the next 2 requests for it get 503
    server.delay_s["b.webm"] = 5.0   # every request for it waits 5 s before answering
    server.cut["c.webm"] = 1         # the next request for it gets half its body, then the connection closes
    server.requests["a.webm"]        # requests seen for it (ranges included)

    with RangeServer(folder) as server:
        url = server.url("train/cls/a.webm")
"""

from __future__ import annotations

import collections
import http.server
import os
import re
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Handler(http.server.BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        owner = self.server.owner
        rel = unquote(urlsplit(self.path).path).lstrip("/")
        name = rel.rsplit("/", 1)[-1]
        with owner.lock:
            owner.requests[name] += 1
            failing = owner.fail.get(name, 0)
            if failing:
                owner.fail[name] = failing - 1
            cutting = owner.cut.get(name, 0) if body else 0
            if cutting:
                owner.cut[name] = cutting - 1
        delay = owner.delay_s.get(name, 0.0)
        if delay:
            time.sleep(delay)
        if failing:
            return self._plain(503, b"busy, try again")
        path = (owner.root / rel).resolve()
        if owner.root not in path.parents or not path.is_file():
            return self._plain(404, b"not found")
        data = path.read_bytes()
        start, end, status = 0, len(data), 200
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if match and (match.group(1) or match.group(2)):
            if match.group(1):
                start = int(match.group(1))
                end = min(len(data), int(match.group(2)) + 1) if match.group(2) else len(data)
            else:
                start = max(0, len(data) - int(match.group(2)))
            if start >= len(data):
                return self._plain(416, b"range not satisfiable")
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if cutting:
            self.wfile.write(data[start:start + (end - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # mid-body: the client sees the connection end early
            return
        if body:
            try:
                self.wfile.write(data[start:end])
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a time limit)

    def _plain(self, status: int, text: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: "RangeServer"


class RangeServer:
    """Serves ``root`` on ``http://127.0.0.1:PORT/`` from a thread (see the module doc)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.fail: dict[str, int] = {}
        self.delay_s: dict[str, float] = {}
        self.cut: dict[str, int] = {}
        self.requests: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="range-server", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, rel: str | os.PathLike = "") -> str:
        """The URL of ``rel`` (a path under the root); of the root itself, ending in ``/``, without one."""
        return f"http://127.0.0.1:{self.port}/" + (Path(rel).as_posix() if str(rel) else "")

    def __enter__(self) -> "RangeServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
