"""What a video's address is: a local path or a URI, and how a URI is shown without its secrets.

A video is named by a local path, a ``file://`` URI, or any fsspec URL
(``s3://bucket/key``, ``gs://``, ``http(s)://``, ``hf://``). Credentials and
endpoints come only from the client library's standard configuration (for
S3: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
``AWS_ENDPOINT_URL``), never from the URI. A URI that carries one anyway
(``https://user:password@host/...``, a signed URL's ``X-Amz-Signature``) is
refused (:func:`refuse_secrets`), and every message that shows a URI shows it
through :func:`redact`::

    https://me:hunter2@host/a.mp4              ->  https://***@host/a.mp4
    https://b.s3.amazonaws.com/a.mp4?X-Amz-Signature=ab12&X-Amz-Expires=60
                                               ->  https://b.s3.amazonaws.com/a.mp4?X-Amz-Signature=***&X-Amz-Expires=***
    s3://bucket/kinetics/train/a.mp4           ->  unchanged (nothing secret)
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, urlsplit

#: ``scheme://``, a scheme of two letters or more (``C:\\`` is a Windows drive, not a scheme).
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
#: Query parameters that are credentials: signed URLs of S3, GCS and Azure, and bearer tokens.
_SECRET_KEYS = frozenset(k.lower() for k in (
    "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "Signature", "AWSAccessKeyId",
    "X-Goog-Signature", "X-Goog-Credential", "GoogleAccessId", "sig", "token", "access_token", "api_key",
    "apikey", "key", "password", "secret"))

#: What a URI with a secret is told to do instead.
CREDENTIALS_FIX = ("give credentials through the client library's standard configuration (for S3: "
                   "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_ENDPOINT_URL for the endpoint; "
                   "for HTTP, a store that needs none) and name the videos without them")


class SecretInURIError(ValueError):
    """A URI carries a credential (a password, a signature, a token); daliload never uses one from a URI."""


def protocol_of(uri: str | os.PathLike) -> str | None:
    """The URI's scheme, lower case (``"s3"``, ``"https"``, ``"file"``), or ``None`` for a plain path."""
    if not isinstance(uri, str):
        return None
    match = _SCHEME.match(uri)
    return match.group(1).lower() if match else None


def is_remote(uri: str | os.PathLike) -> bool:
    """Whether ``uri`` names an object behind fsspec rather than a local file (``file://`` is local)."""
    return protocol_of(uri) not in (None, "file", "local")


def local_path(uri: str | os.PathLike) -> str:
    """The local path of a plain path or a ``file://`` URI (``file:///data/a.mp4`` -> ``/data/a.mp4``)."""
    name = os.fspath(uri)
    if isinstance(name, str) and protocol_of(name) in ("file", "local"):
        from urllib.parse import unquote

        return unquote(urlsplit(name).path)
    return name


def redact(uri: str | os.PathLike) -> str:
    """``uri`` as it may be shown: user information and every query value replaced by ``***``.

    A plain path, or a URI with neither, comes back unchanged (the same string).
    """
    name = os.fspath(uri)
    if not isinstance(name, str) or protocol_of(name) is None or ("@" not in name and "?" not in name):
        return name if isinstance(name, str) else os.fsdecode(name)
    parts = urlsplit(name)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        query = "&".join(f"{key}=***" for key, _ in parse_qsl(query, keep_blank_values=True))
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    return shown + (f"?{query}" if parts.query else "") + (f"#{parts.fragment}" if parts.fragment else "")


def secret_in(uri: str | os.PathLike) -> str | None:
    """What secret ``uri`` carries (``"a password"``, ``"a signature (X-Amz-Signature)"``), or ``None``."""
    name = os.fspath(uri)
    if not isinstance(name, str) or protocol_of(name) is None:
        return None
    parts = urlsplit(name)
    if "@" in parts.netloc:
        return "a user name or password" if ":" in parts.netloc.rsplit("@", 1)[0] else "a user name or token"
    for key, _ in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() in _SECRET_KEYS:
            return f"a credential in its query ({key})"
    return None


def refuse_secrets(uri: str | os.PathLike) -> None:
    """Raise :class:`SecretInURIError` (showing the URI redacted) if ``uri`` carries a credential."""
    what = secret_in(uri)
    if what is not None:
        raise SecretInURIError(f"{redact(uri)}: the URI carries {what}, which daliload never uses or shows; "
                               f"{CREDENTIALS_FIX}")
