"""Opening a video's bytes (``daliload.stream``): regular files only, refused before any read can block."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from daliload.stream import NotARegularFile, read_video_file, require_regular_file


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "v.webm"
    path.write_bytes(bytes(range(256)) * 3)
    data = read_video_file(path)
    assert data.dtype == np.uint8 and data.tobytes() == bytes(range(256)) * 3
    require_regular_file(path)
    link = tmp_path / "link.webm"
    link.symlink_to(path)
    assert read_video_file(link).size == 768  # links are followed


def test_what_is_not_a_regular_file_is_refused_unread_naming_what_it_is(tmp_path):
    fifo = tmp_path / "fifo.webm"
    os.mkfifo(fifo)  # no writer: any blocking open or read would wait forever
    sock_path = tmp_path / "sock.webm"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        for path, what in [(fifo, "a FIFO"), (tmp_path, "a directory"), (sock_path, "a socket"),
                           ("/dev/zero", "a character device")]:
            with pytest.raises(NotARegularFile, match=f"not a regular file: it is {what}") as info:
                require_regular_file(path)
            assert info.value.filename == os.fspath(path)
            with pytest.raises(OSError) as info:  # a socket cannot even be opened (ENXIO): refused all the same
                read_video_file(path)
            assert info.value.filename == os.fspath(path)
            assert isinstance(info.value, NotARegularFile) or path == sock_path
    finally:
        server.close()


def test_an_empty_or_missing_file_names_itself(tmp_path):
    empty = tmp_path / "empty.webm"
    empty.touch()
    with pytest.raises(OSError, match="file is empty") as info:
        read_video_file(empty)
    assert info.value.filename == str(empty)
    with pytest.raises(FileNotFoundError):
        read_video_file(tmp_path / "missing.webm")
