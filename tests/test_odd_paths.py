"""Paths are bytes where the OS says so: a dataset root whose own name is not UTF-8 (its files' names neither) goes
end to end, through DALI and the fallback; a root given as ``bytes`` is taken; and a manifest that cannot be
written anywhere it would go is refused with the option that fixes it."""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from pathlib import Path

import pytest
from helpers.frames import check_passes
from helpers.readonly import read_only

from daliload.cli import main
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.prescreen import Manifest, ScanSpec, scan
from daliload.prescreen.ensure import forget_checks
from daliload.prescreen.scan import ScanSummary, cache_manifest_path

#: Bytes that are not UTF-8 (a Latin-1 name, a damaged download): Python names them with surrogates.
ROOT_NAME = b"kinetics_\xff"
FILE_NAME = b"clip_\xfe"


def _fsjoin(folder: str | os.PathLike, name: bytes) -> str:
    return os.fsdecode(os.fsencode(folder) + b"/" + name)


@pytest.fixture(scope="module")
def odd_root(tmp_path_factory, make_clip) -> str:
    """ROOT (named ``kinetics_\\xff``)/train/{juggling,abseiling}/, each an H.264 MP4 and a VP9 WebM named
    ``clip_\\xfe`` (64x48, 30 frame-coded frames); the ``str`` os.fsdecode gives for ROOT."""
    root = _fsjoin(tmp_path_factory.mktemp("odd"), ROOT_NAME)
    for class_id, name in enumerate(("juggling", "abseiling"), start=1):
        folder = Path(root) / "train" / name
        folder.mkdir(parents=True)
        for codec in ("h264", "vp9"):
            clip = make_clip(codec, num_frames=30, width=64, height=48, class_id=class_id)
            shutil.copyfile(clip, _fsjoin(folder, FILE_NAME + os.fsencode(clip.suffix)))
    return root


def _loader(root, **kw) -> KineticsDALILoader:
    kw.setdefault("decode", DecodeSpec(fallback_workers=1, routing="static"))
    return KineticsDALILoader(root, "train", batch_size=2, clip_len=4, frame_stride=2, device="cpu",
                              augment=AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.0),
                              output=OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32"),
                              **kw)


class _Strict(logging.Handler):
    """What a log file that encodes strictly (``logging.FileHandler``) would refuse: messages with no UTF-8."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.refused: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            self.refused.append(ascii(text))


@pytest.fixture
def strict_log():
    handler, package = _Strict(), logging.getLogger("daliload")
    level = package.level
    package.addHandler(handler)
    package.setLevel(logging.DEBUG)
    yield handler
    package.removeHandler(handler)
    package.setLevel(level)


def test_a_root_whose_name_is_not_utf8_is_scanned_and_trained_on_through_dali_and_the_fallback(odd_root,
                                                                                                strict_log):
    """The manifest under such a root is written and then opened (its SQLite URI once refused the name); the
    VP9 files go through DALI's CPU decoder, the H.264 ones through the fallback, every clip the planned frames,
    and nothing the package logs or warns holds a name a strict UTF-8 log file refuses."""
    odd = {_fsjoin(Path(odd_root) / "train" / name, FILE_NAME + ext)
           for name in ("juggling", "abseiling") for ext in (b".mp4", b".webm")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = _loader(odd_root)
        try:
            assert loader.manifest_path == Path(odd_root) / ".daliload" / "manifest.sqlite"
            assert {v.path for v in loader.videos} == odd and loader.rejected == ()
            assert {s.path for s in check_passes(loader)} == odd
            stats = loader.stats()
            assert stats.clips_dali > 0 and stats.clips_fallback > 0 and stats.failures == ()
            from daliload.prescreen.byte_indexes import ByteIndexes

            indexes = ByteIndexes(loader.manifest_path)  # the fallback's hints ask it for each file's rotation
            assert {indexes.rotation(path) for path in odd} == {0}
            indexes.close()
        finally:
            loader.close()
    for warning in caught:
        str(warning.message).encode("utf-8")  # a warning's text shows such a name as \xff
    assert strict_log.refused == []
    with Manifest(loader.manifest_path) as manifest:
        assert manifest.last_scan["probed"] == 4
    # `daliload scan` prints its summary on stdout, which may take strict UTF-8 only
    summary = ScanSummary(manifest_path=loader.manifest_path, device="cpu", deep=False, splits=("train",),
                          total=4, probed=0, reused=4, removed=0, missing=0)
    assert f"manifest: {os.fsencode(odd_root).decode('utf-8', 'backslashreplace')}/" in summary.format()
    summary.format().encode("utf-8")


def test_a_root_given_as_bytes_is_read_as_os_fsdecode_reads_it(odd_root):
    """``os.fsencode(root)`` or a name from ``os.listdir(b"...")``: the same dataset, manifest and videos as the
    ``str``, for the loader, a manifest given as the root, and :func:`scan`."""
    scan(os.fsencode(odd_root), device="cpu", workers=0, splits=("train",), progress=False)
    forget_checks()
    loader = _loader(os.fsencode(odd_root))
    try:
        assert loader.manifest_path == Path(odd_root) / ".daliload" / "manifest.sqlite"
        assert len({s.path for s in check_passes(loader)}) == 4
    finally:
        loader.close()
    given = _loader(os.fsencode(loader.manifest_path), decode=DecodeSpec(decoder="fallback", fallback_workers=0))
    try:
        assert given.manifest_path == loader.manifest_path and len(given.videos) == 4
    finally:
        given.close()


@pytest.fixture
def read_only_copy(odd_root, tmp_path, monkeypatch) -> tuple[str, Path]:
    """A copy of the odd root without its manifest, and an empty cache folder (``XDG_CACHE_HOME``)."""
    root = _fsjoin(tmp_path, ROOT_NAME)
    shutil.copytree(odd_root, root, ignore=shutil.ignore_patterns(".daliload"))
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return root, cache


def test_a_read_only_root_with_no_manifest_and_no_writable_cache_says_to_pass_scan_spec_manifest_path(
        read_only_copy, tmp_path, capsys):
    """It once raised a bare FileNotFoundError of the cache file; the loader and `daliload scan` say where the
    manifest would go, why it cannot, and the option that fixes it, which then works."""
    root, cache = read_only_copy
    with read_only(Path(root)), read_only(cache):
        with pytest.raises(PermissionError, match=r"no manifest of its own.*per-user cache.*cannot be written.*"
                                                  r"ScanSpec\(manifest_path=PATH\)"):
            _loader(root)
        assert main(["scan", root, "--device", "cpu", "--workers", "0", "--quiet"]) == 2
        assert "daliload scan ROOT --manifest PATH" in capsys.readouterr().err
        with pytest.raises(PermissionError, match=r"the manifest .*m\.sqlite does not exist and its folder cannot "
                                                  r"be written; give the manifest a writable path"):
            _loader(root, scan=ScanSpec(manifest_path=cache / "m.sqlite"))
        loader = _loader(root, scan=ScanSpec(manifest_path=tmp_path / "m.sqlite"),
                         decode=DecodeSpec(decoder="fallback", fallback_workers=0))
        assert len(loader.videos) == 4
        loader.close()
    assert not cache_manifest_path(root).exists()


def test_a_read_only_root_whose_manifest_is_out_of_date_and_no_writable_cache_names_the_option(read_only_copy):
    root, cache = read_only_copy
    scan(root, device="cpu", workers=0, splits=("train",), progress=False)
    victim = _fsjoin(Path(root) / "train" / "juggling", FILE_NAME + b".mp4")
    with open(victim, "ab") as f:
        f.write(b"\0")  # the file changes after its manifest was written
    forget_checks()
    with read_only(Path(root)), read_only(cache):
        with pytest.raises(PermissionError, match=r"1 file\(s\) of .*kinetics_\\xff changed since its manifest.*"
                                                  r"cannot be written either.*ScanSpec\(manifest_path=PATH\)"):
            _loader(root)
