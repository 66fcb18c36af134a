"""Reading a remote video's bytes: exact ranges, a time limit per request, retries with backoff, counted.

Every read goes through :func:`fetch`: one fsspec ``cat_file(path, start,
end)`` per request (never fsspec's buffered files, whose defaults fetch 5 MiB,
and s3fs's 50 MiB, blocks: a Kinetics clip is about 1 MB). PyAV reads a
remote video through :class:`RangeFile`, a file object that asks for
``max(n, block)`` bytes where FFmpeg asks for ``n`` (``block`` is 64 KiB) and
keeps only the last block.

Time limits and retries (:class:`ReadPolicy`): each request has a time limit
(the smaller of ``timeout_s`` and what is left of the caller's deadline);
transient errors (a 5xx answer, throttling, a reset or refused connection,
a request past its time limit) are retried after ``backoff_s * 2**attempt``
seconds, up to ``attempts`` requests; the client libraries' own retries are
turned off so that every request is one of ours and counted. What still
fails raises :class:`RemoteReadError` (an ``OSError``), naming the redacted
URI and the cause, which the decoders turn into a failed sample like any
unreadable file.

Counters (:func:`transfer_counts`) are per process: bytes received, requests
made, retries, reads that failed.
"""

from __future__ import annotations

import errno
import io
import os
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

from daliload.stream._uri import protocol_of, redact

#: Bytes one request of :class:`RangeFile` asks for at least (FFmpeg reads 32 KiB at a time).
RANGE_BLOCK_BYTES = 64 * 1024
#: Error codes of S3-compatible stores that mean "try again" (throttling, an overloaded or failing server).
_TRANSIENT_CODES = frozenset(("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
                              "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "503", "500"))
#: Error codes of S3-compatible stores that mean the credentials are missing or wrong.
_CREDENTIAL_CODES = frozenset(("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                               "InvalidToken", "InvalidClientTokenId", "AllAccessDisabled", "AccountProblem"))


@dataclass(frozen=True)
class ReadPolicy:
    """Time limit and retries of every remote request.

    Attributes:
        timeout_s: seconds one request may take (connect and body), at most.
        attempts: requests per read, at most (1: no retry).
        backoff_s: seconds before the first retry; doubled before each next one.
    """

    timeout_s: float = 20.0
    attempts: int = 4
    backoff_s: float = 0.25

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts!r}")
        if self.backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0 seconds, got {self.backoff_s!r}")


DEFAULT_POLICY = ReadPolicy()


class RemoteReadError(OSError):
    """A remote read that failed for good: ``filename`` is the redacted URI, ``strerror`` the cause.

    Attributes:
        transient: the last error was of a kind that retrying may cure (it ran out of attempts or time).
        code: the store's error code or HTTP status, when it gave one.
    """

    def __init__(self, uri: str, reason: str, *, number: int = errno.EIO, transient: bool = False,
                 code: str | None = None) -> None:
        super().__init__(number, reason, redact(uri))
        self.transient = transient
        self.code = code

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"

    def __reduce__(self):
        # Crosses process boundaries (worker processes) intact; the URI is already redacted.
        return (_rebuild, (self.filename, self.strerror, self.errno, self.transient, self.code))


def _rebuild(uri, reason, number, transient, code) -> RemoteReadError:
    return RemoteReadError(uri, reason, number=number, transient=transient, code=code)


class TransferCounts(NamedTuple):
    """What this process read from remote stores since it started (with what its workers reported to it).

    Attributes:
        remote_bytes: bytes received (bodies only).
        remote_requests: requests made (ranged reads, whole-object reads, size look-ups), retries included.
        remote_retries: requests that repeated one that failed with a transient error.
        remote_failed_reads: reads that failed for good (:class:`RemoteReadError`).
    """

    remote_bytes: int = 0
    remote_requests: int = 0
    remote_retries: int = 0
    remote_failed_reads: int = 0


_counts_lock = threading.Lock()
_counts = [0, 0, 0, 0]


def _count(**add: int) -> None:
    with _counts_lock:
        for i, name in enumerate(TransferCounts._fields):
            _counts[i] += add.get(name, 0)


def add_transfer_counts(counts: TransferCounts) -> None:
    """Count reads another process made for this one (a worker's, sent back with its result) as this process's."""
    _count(**counts._asdict())


def transfer_counts() -> TransferCounts:
    """This process's remote reads so far, with those its workers reported (see :class:`TransferCounts`)."""
    with _counts_lock:
        return TransferCounts(*_counts)


# -- file systems ---------------------------------------------------------------------------

_filesystems: dict[tuple[int, str], object] = {}
_fs_lock = threading.Lock()


def filesystem(uri: str):
    """``(fs, path)``: this process's fsspec file system for ``uri``'s protocol, and the path in it.

    One instance per protocol and process, made here (not fsspec's shared
    cache) because its client's retries are turned off: ours count them.
    Credentials and endpoints are the client library's own configuration.
    """
    import fsspec

    protocol = protocol_of(uri)
    key = (os.getpid(), protocol)
    with _fs_lock:
        fs = _filesystems.get(key)
        if fs is None:
            options: dict = {"skip_instance_cache": True}
            if protocol in ("s3", "s3a"):
                options["config_kwargs"] = {"retries": {"total_max_attempts": 1, "mode": "standard"},
                                            "connect_timeout": DEFAULT_POLICY.timeout_s,
                                            "read_timeout": DEFAULT_POLICY.timeout_s}
            fs = fsspec.filesystem(protocol, **options)
            if hasattr(fs, "retries"):
                fs.retries = 1  # s3fs's own retry loop: once
            _filesystems[key] = fs
    return fs, type(fs)._strip_protocol(uri)


# -- errors ---------------------------------------------------------------------------------


def _causes(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def classify(err: BaseException) -> tuple[str, bool, str | None]:
    """``(kind, transient, code)`` of a client library's error: kind is ``"missing"``, ``"credentials"``,
    ``"range"``, ``"timeout"``, ``"connection"``, ``"server"`` or ``"other"``; code the store's code or HTTP
    status."""
    import asyncio

    code, status = None, None
    for cause in _causes(err):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and "Error" in response:  # botocore's ClientError
            code = response["Error"].get("Code") or code
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or status
        if isinstance(getattr(cause, "status", None), int):  # aiohttp's ClientResponseError
            status = cause.status
    name = " ".join(type(c).__name__ for c in _causes(err))
    if code in _CREDENTIAL_CODES or status in (401, 403) or isinstance(err, PermissionError):
        return "credentials", False, code or (str(status) if status else None)
    if code in ("NoSuchKey", "NoSuchBucket", "404") or status == 404 or isinstance(err, FileNotFoundError):
        return "missing", False, code or (str(status) if status else None)
    if code == "InvalidRange" or status == 416:
        return "range", False, code or str(status)
    if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
        return "server", True, code or str(status)
    if any(isinstance(c, (TimeoutError, asyncio.TimeoutError)) for c in _causes(err)) or "Timeout" in name:
        return "timeout", True, None
    if any(isinstance(c, ConnectionError) for c in _causes(err)) or any(
            word in name for word in ("ClientConnector", "ServerDisconnected", "ClientPayload", "ClientOSError",
                                      "EndpointConnection", "ConnectionClosed", "IncompleteRead")):
        return "connection", True, None
    return "other", False, code


def _client_errors() -> tuple[type[BaseException], ...]:
    """The errors fsspec's clients raise for a failed request (OSError covers fsspec's own and s3fs's)."""
    import asyncio

    errors: list[type[BaseException]] = [OSError, ValueError, RuntimeError, asyncio.TimeoutError]
    try:
        import aiohttp

        errors.append(aiohttp.ClientError)
    except ImportError:
        pass
    try:
        import botocore.exceptions

        errors += [botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError]
    except ImportError:
        pass
    return tuple(errors)


def _reason(kind: str, err: BaseException, code: str | None) -> str:
    text = str(err).strip() or type(err).__name__
    if kind == "missing" and code == "NoSuchBucket":
        return "the bucket does not exist (NoSuchBucket)"
    if kind == "missing":
        return f"not found ({code or 'no such object'}; deleted or moved since the scan?)"
    if kind == "credentials":
        return (f"the store refused the credentials ({code or text}): check AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY or AWS_PROFILE (and AWS_ENDPOINT_URL for the endpoint)")
    if kind == "range":
        return (f"the object is shorter than when scanned ({code}: replaced since the scan? "
                "run `daliload scan` again)")
    if kind == "timeout":
        return "the store did not answer in time"
    if kind == "connection":
        return (f"the store could not be reached ({type(err).__name__}: {text}): check its endpoint "
                "(AWS_ENDPOINT_URL for an S3-compatible store) and the network")
    return f"{type(err).__name__}: {text}" + (f" ({code})" if code and code not in text else "")


# -- reads ----------------------------------------------------------------------------------


def fetch(uri: str, start: int | None = None, end: int | None = None, *, policy: ReadPolicy = DEFAULT_POLICY,
          deadline: float | None = None) -> bytes:
    """Bytes ``start .. end`` (end exclusive; ``None``: the whole object) of the remote ``uri``.

    Args:
        uri: an fsspec URL.
        start, end: byte offsets.
        policy: time limit per request, attempts, backoff.
        deadline: ``time.monotonic()`` past which no request starts and none runs on (the caller's own limit).

    Raises:
        RemoteReadError: not found, credentials refused, or a transient error on every attempt or past the
            deadline; names the redacted URI and the cause.
    """
    return _with_retries(uri, "read", policy, deadline, lambda fs, path, timeout: _cat(fs, path, start, end,
                                                                                        timeout))


def size_of(uri: str, *, policy: ReadPolicy = DEFAULT_POLICY, deadline: float | None = None) -> int:
    """The remote object's size in bytes (one request). Raises as :func:`fetch`."""
    return _with_retries(uri, "size look-up", policy, deadline,
                         lambda fs, path, timeout: int(fs.size(path, **_timeout_kw(fs, timeout))))


class RemoteObject(NamedTuple):
    """One object under a listed prefix: its key relative to the prefix, size in bytes and modification time (ns)."""

    key: str
    size: int
    mtime_ns: int


def list_objects(uri: str, *, policy: ReadPolicy = DEFAULT_POLICY) -> list[RemoteObject]:
    """Every object under the prefix ``uri`` (a "folder" of a store), with sizes and modification times.

    One listing call (fsspec's ``find``: for S3, one request per 1,000 keys),
    retried as :func:`fetch` is. Keys are relative to ``uri``, ``/``-separated,
    sorted.

    Raises:
        RemoteReadError: the bucket does not exist, the credentials are refused, the store fails;
            or the prefix holds nothing (``errno.ENOENT``), or the protocol cannot list (``http(s)://``).
    """
    if protocol_of(uri) in ("http", "https"):
        raise RemoteReadError(uri, "an HTTP server cannot be listed: scan the videos where they can be listed "
                                   "and pass the manifest (docs/remote.md)", number=errno.EINVAL)
    found = _with_retries(uri, "listing", policy, None,
                          lambda fs, path, timeout: (path, fs.find(path, detail=True, withdirs=False,
                                                                   **_timeout_kw(fs, timeout))))
    base, details = found
    base = base.rstrip("/") + "/"
    objects = []
    for name, info in details.items():
        if not name.startswith(base) or info.get("type", "file") != "file":
            continue
        objects.append(RemoteObject(name[len(base):], int(info.get("size") or 0), _mtime_ns(info)))
    if not objects:
        raise RemoteReadError(uri, "listing found no object under this prefix (a typo, or the wrong bucket?)",
                              number=errno.ENOENT)
    return sorted(objects)


def _mtime_ns(info: dict) -> int:
    """An object's modification time from a listing's details, whatever the store calls it (0 if none)."""
    import datetime

    for key in ("LastModified", "mtime", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            return int(value.timestamp() * 1e9)
        if isinstance(value, (int, float)):
            return int(value * 1e9)
        if isinstance(value, str):
            try:
                return int(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1e9)
            except ValueError:
                continue
    return 0


def _timeout_kw(fs, timeout: float) -> dict:
    # fsspec's async file systems take `timeout` in their blocking wrappers and cancel the request past it.
    return {"timeout": timeout} if getattr(fs, "async_impl", False) else {}


def _cat(fs, path: str, start: int | None, end: int | None, timeout: float) -> bytes:
    data = fs.cat_file(path, start=start, end=end, **_timeout_kw(fs, timeout))
    if start is not None and end is not None and len(data) > end - start:
        data = data[start:end]  # a server that ignored the Range header sent the whole object
    return data


def _with_retries(uri: str, what: str, policy: ReadPolicy, deadline: float | None, call):
    fs, path = filesystem(uri)
    last: BaseException | None = None
    for attempt in range(policy.attempts):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            break
        if attempt:
            pause = policy.backoff_s * 2 ** (attempt - 1)
            if left is not None and pause >= left:
                break
            time.sleep(pause)
            left = None if deadline is None else deadline - time.monotonic()
        timeout = policy.timeout_s if left is None else max(min(policy.timeout_s, left), 0.001)
        _count(remote_requests=1, remote_retries=1 if attempt else 0)
        try:
            result = call(fs, path, timeout)
        except _client_errors() as err:
            kind, transient, code = classify(err)
            last = err
            if not transient:
                _count(remote_failed_reads=1)
                number = {"missing": errno.ENOENT, "credentials": errno.EACCES}.get(kind, errno.EIO)
                raise RemoteReadError(uri, f"{what} failed: {_reason(kind, err, code)}", number=number,
                                      code=code) from err
            continue
        _count(remote_bytes=len(result) if isinstance(result, bytes) else 0)
        return result
    _count(remote_failed_reads=1)
    if last is None:
        raise RemoteReadError(uri, f"{what} failed: the time limit passed before a request could start",
                              number=errno.ETIMEDOUT, transient=True)
    kind, _, code = classify(last)
    spent = "within the caller's time limit" if deadline is not None and attempt + 1 < policy.attempts \
        else f"in {attempt + 1} request(s)"
    raise RemoteReadError(uri, f"{what} failed {spent}: {_reason(kind, last, code)}",
                          number=errno.ETIMEDOUT if kind == "timeout" else errno.EIO, transient=True,
                          code=code) from last


class RangeReader(io.RawIOBase):
    """A read-only, seekable binary file of ``size`` bytes whose reads a subclass makes (``read(n)``), for PyAV.

    After a read fails it reads as ended: FFmpeg reads again after an error,
    and the first error is the one PyAV raises (a second one it would print
    as "dropped").
    """

    size: int

    def __init__(self) -> None:
        super().__init__()
        self._pos = 0
        self._failed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _wanted(self, n: int | None) -> int:
        """How many of ``n`` bytes (all, for ``None`` or negative) a read at the position can give; 0 once failed."""
        left = self.size - self._pos
        n = left if n is None or n < 0 else min(n, left)
        return 0 if self._failed else max(n, 0)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class RangeFile(RangeReader):
    """A remote video as a seekable binary file for PyAV: each read is one ranged request (see the module doc).

    Args:
        uri: an fsspec URL.
        policy: time limit and retries of each request.
        deadline: ``time.monotonic()`` past which reads fail (the decode's own time limit).
        block: bytes asked for at least per request.
        base, size: the file is bytes ``base .. base + size`` of the object (a shard's member);
            ``size=None``: the whole object, its size read with one request.

    Raises:
        RemoteReadError: at construction, when the object's size cannot be read (one request).
    """

    def __init__(self, uri: str, *, policy: ReadPolicy = DEFAULT_POLICY, deadline: float | None = None,
                 block: int = RANGE_BLOCK_BYTES, base: int = 0, size: int | None = None) -> None:
        super().__init__()
        self.uri, self.policy, self.deadline, self.block = uri, policy, deadline, block
        # A member of a shard is the range [base, base + size) of its object: no size request.
        self.base = base
        self.size = size_of(uri, policy=policy, deadline=deadline) if size is None else size
        self._cached_at, self._cached = 0, b""

    def read(self, n: int = -1) -> bytes:
        n = self._wanted(n)
        if n <= 0:
            return b""
        offset = self._pos - self._cached_at
        if not 0 <= offset or offset + n > len(self._cached):
            end = min(self.size, self._pos + max(n, self.block))
            try:
                data = fetch(self.uri, self.base + self._pos, self.base + end, policy=self.policy,
                             deadline=self.deadline)
            except RemoteReadError:
                self._failed = True
                raise
            self._cached_at, self._cached, offset = self._pos, data, 0
        data = self._cached[offset:offset + n]
        self._pos += len(data)
        return data
