"""A remote window in one request: the scan's byte index, the header cache, and both decoders reading from them.

Files of 300 frames with a keyframe every 16 (VP9 in WebM; H.264 in MP4 with
its index at the end and at the front, and in Matroska) are probed locally
(the byte index), uploaded to an S3 server (moto) on 127.0.0.1, and cut (the
DALI route's window cut) and decoded (the fallback) through their URIs. The
cuts' bytes and the frames equal those from the local files; the requests are
counted: the header's ranges and the window at the first read of a file, the
window alone after it, and nothing fetched later (the index was right). An
index that is wrong costs requests, never a frame.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

import numpy as np
import pytest

from daliload.prescreen.byte_indexes import ByteIndexes
from daliload.prescreen.probe import probe_file
from daliload.stream import clear_header_cache, open_window, transfer_counts
from daliload.stream._window import READ_FORWARD
from daliload.stream.byteindex import END_SLACK, KEY_SLACK, ByteIndex, build_byte_index
from daliload.stream.cut import cut_window
from daliload.stream.numbering import StreamHint
from daliload.synth.content import render_clip
from daliload.synth.encode import default_spec, write_video
from fallback.decode import decode_window
from helpers.s3_store import s3_server
from test_dali_cut import codes_of, nvdec_codes

BUCKET = "windows"
#: name -> (codec, container options)
FILES = {"vp9.webm": ("vp9", None), "h264.mp4": ("h264", None),
         "h264-faststart.mp4": ("h264", {"movflags": "faststart"}), "h264.mkv": ("h264", None)}
#: windows of 16 frames at stride 4 (the default clip), early, in the middle, late, and one past the end
WINDOWS = [list(range(20, 84, 4)), list(range(130, 194, 4)), list(range(236, 300, 4)), list(range(280, 344, 4))]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("windows")
    for name, (codec, options) in FILES.items():
        write_video(root / name, render_clip(2, 300, width=320, height=240), default_spec(codec, gop=16),
                    container_options=options)
    return root


@pytest.fixture(scope="module")
def store(files):
    with s3_server() as (client, endpoint):
        client.create_bucket(Bucket=BUCKET)
        for path in files.iterdir():
            client.upload_file(str(path), BUCKET, path.name)
        yield client


def hint_of(path, *, reads=True) -> StreamHint:
    facts = probe_file(path)
    assert facts.ok, facts.reason
    index = ByteIndex.decode(facts.byte_index) if reads else None
    return StreamHint(facts.keyframes, facts.fps, facts.num_frames, reads=index)


def packets(cut) -> tuple:
    """What a cut holds: where it starts and its packets (Matroska's header has a random segment id)."""
    import io

    import av
    with av.open(io.BytesIO(cut.data)) as container:
        return cut.first_frame, cut.frames, [(p.pts, p.dts, bytes(p)) for p in container.demux(video=0)]


def counted(call):
    before = transfer_counts()
    result = call()
    after = transfer_counts()
    return result, after.remote_requests - before.remote_requests, after.remote_bytes - before.remote_bytes


# -- the index ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_scan_records_where_every_keyframe_and_frame_lies(files, name):
    facts = probe_file(files / name)
    index = ByteIndex.decode(facts.byte_index)
    assert index is not None and index.size == (files / name).stat().st_size
    assert len(index.key_offsets) == len(facts.keyframes) == 300 // 16 + 1 and len(index.frame_ends) == 300
    assert ByteIndex.decode(index.encode()) == index
    assert len(facts.byte_index) < 4 * 300  # a few bytes a frame in the manifest
    import av
    with av.open(str(files / name)) as container:
        packets = [(p.pos, p.size, p.pts) for p in container.demux(video=0) if p.size]
    by_pts = sorted(packets, key=lambda p: p[2])
    assert index.first_pts == by_pts[0][2]
    for k, offset in zip(facts.keyframes, index.key_offsets):
        assert offset == by_pts[k][0]
    for f in (0, 17, 150, 299):  # the end of the last packet, in decode order, holding frame f or earlier
        assert index.frame_ends[f] == max(p + s for p, s, pts in packets if pts <= by_pts[f][2])


def test_an_index_is_refused_for_packets_out_of_byte_order_or_unknown_positions():
    assert build_byte_index(1000, [10, 5], [5, 5], [0, 1], [0], 0) is None
    assert build_byte_index(1000, [-1, 20], [5, 5], [0, 1], [0], 0) is None
    assert build_byte_index(10, [0, 5], [5, 6], [0, 1], [0], 0) is None  # past the file's end
    index = build_byte_index(1000, [100, 300, 200 + 200], [200, 100, 50], [0, 2, 1], [0, 1], -7)
    assert index.first_pts == -7 and index.frame_ends == (300, 450, 450) and index.key_offsets == (100, 400)
    assert index.window([0, 1], 1, 2) == (400 - KEY_SLACK, 450 + END_SLACK)
    assert ByteIndex.decode(b"\x09rest") is None and ByteIndex.decode(b"\x01\x80") is None


def test_a_hint_whose_byte_index_follows_other_keyframes_drops_it():
    index = build_byte_index(1000, [100, 300], [200, 100], [0, 1], [0, 1], 0)
    assert StreamHint((0, 1), 30, reads=index).reads is index
    assert StreamHint((0,), 30, reads=index).reads is None


def test_the_loaders_lookup_reads_one_video_from_the_manifest_and_an_old_manifest_has_none(files, tmp_path):
    import sqlite3
    good = tmp_path / "m.sqlite"
    with sqlite3.connect(good) as db:
        db.execute("CREATE TABLE byte_index (path TEXT PRIMARY KEY, data BLOB NOT NULL)")
        db.execute("INSERT INTO byte_index VALUES (?, ?)", ("s3://b/x.mp4", probe_file(files / "h264.mp4").byte_index))
    db.close()
    lookup = ByteIndexes(good)
    assert lookup("s3://b/x.mp4").size == (files / "h264.mp4").stat().st_size and lookup("s3://b/y.mp4") is None
    lookup.close()
    old = tmp_path / "old.sqlite"
    sqlite3.connect(old).close()
    assert ByteIndexes(old)("s3://b/x.mp4") is None


# -- one request per window ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_remote_window_cut_reads_the_header_once_and_then_one_request_and_equals_the_local_cut(
        store, files, name):
    clear_header_cache()
    local, remote = hint_of(files / name, reads=False), hint_of(files / name)
    uri = f"s3://{BUCKET}/{name}"
    index, keys = remote.reads, remote.keyframe_indices
    for n, frames in enumerate(WINDOWS[:3]):
        expected = cut_window(files / name, frames[0], frames[-1], local)
        got, requests, received = counted(lambda f=frames: cut_window(uri, f[0], f[-1], remote))
        assert got is not None and packets(got) == packets(expected), (name, frames)
        start, end = index.window(remote.keyframe_indices, frames[0], frames[-1])
        least = index.last_packet_end(frames[-1]) - index.key_offsets[bisect.bisect_right(keys, frames[0]) - 1]
        if n == 0:  # the header's ranges and the window, fetched at once (a window near the head joins it)
            assert requests <= len(index.header()) + 1
            assert received <= sum(e - s for s, e in index.header()) + end - start + READ_FORWARD
        elif name.endswith(".mkv"):  # FFmpeg's Matroska muxer puts several GOPs in a cluster, and its demuxer
            # seeks to the cluster and reads from there: the bytes before the entry are fetched when asked
            assert requests <= 2 and received < 0.4 * index.size
        else:  # the header is kept: the window alone, in one request, within a few bytes of the least
            assert requests == 1 and received == end - start <= least + KEY_SLACK + END_SLACK, (name, frames)
            assert received < 0.4 * index.size


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_remote_window_decoded_by_the_fallback_reads_one_request_and_equals_the_local_frames(
        store, files, name):
    clear_header_cache()
    local, remote = hint_of(files / name, reads=False), hint_of(files / name)
    uri = f"s3://{BUCKET}/{name}"
    for n, frames in enumerate(WINDOWS):
        expected = decode_window(files / name, frames, hint=local, num_frames=300)
        got, requests, received = counted(lambda f=frames: decode_window(uri, f, hint=remote, num_frames=300))
        assert np.array_equal(got.frames, expected.frames), (name, frames)
        most = len(remote.reads.header()) + 1 if n == 0 else (2 if name.endswith(".mkv") else 1)  # as for the cut
        assert 1 <= requests <= most, (name, frames, requests)


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_remote_window_from_the_first_keyframe_reads_the_files_start_only(store, files, name):
    """Locally such a window decodes the file from its start; remotely the cut and the seek still save the rest
    of the file: DALI gets a cut and the fallback reads the window's bytes, not the object."""
    clear_header_cache()
    local, remote = hint_of(files / name, reads=False), hint_of(files / name)
    uri, frames = f"s3://{BUCKET}/{name}", list(range(2, 66, 4))
    assert cut_window(files / name, frames[0], frames[-1], local) is None  # nothing to gain locally
    cut, _, received = counted(lambda: cut_window(uri, frames[0], frames[-1], remote))
    assert cut is not None and cut.first_frame == 0 and cut.frames == 63 and received < 0.5 * remote.reads.size
    want = codes_of(files / name)[:63]  # the file's frames 0 .. 62, decoded whole and as NVDEC sees the cut
    assert codes_of(cut.data)[:63] == want and nvdec_codes(cut.data)[:63] == want
    clear_header_cache()
    got, _, received = counted(lambda: decode_window(uri, frames, hint=remote, num_frames=300))
    assert np.array_equal(got.frames, decode_window(files / name, frames, hint=local, num_frames=300).frames)
    assert received < 0.5 * remote.reads.size


@pytest.mark.parametrize("name", sorted(FILES))
def test_random_windows_after_the_first_cost_one_request_and_about_the_least(store, files, name):
    """With the header kept, any window (from the file's start too: it is fetched with the header's range
    inside it) is one request of about its packets' bytes."""
    import random

    clear_header_cache()
    remote = hint_of(files / name)
    index, keys, uri = remote.reads, remote.keyframe_indices, f"s3://{BUCKET}/{name}"
    decode_window(uri, WINDOWS[1], hint=remote, num_frames=300)  # the header, kept
    rng = random.Random(0)
    total = least = 0
    for first in [2] + [rng.randrange(0, 240) for _ in range(8)]:
        frames = list(range(first, first + 61, 4))
        _, requests, received = counted(lambda f=frames: decode_window(uri, f, hint=remote, num_frames=300))
        assert requests <= (2 if name.endswith(".mkv") else 1), (name, first)  # Matroska: see above
        total += received
        least += index.last_packet_end(frames[-1]) - index.key_offsets[bisect.bisect_right(keys, first) - 1]
    assert total <= 1.1 * least, (name, total / least)


def test_a_wrong_byte_index_costs_requests_never_a_frame(store, files):
    """Offsets shifted into the previous GOP and ends cut short: the reads outside are fetched when asked."""
    clear_header_cache()
    name = "h264.mp4"
    local, remote = hint_of(files / name, reads=False), hint_of(files / name)
    index = remote.reads
    wrong = replace(index, key_offsets=tuple(max(k - 5000, 0) for k in index.key_offsets),
                    frame_ends=tuple(max(e - 3000, index.head_end) for e in index.frame_ends))
    hint = replace(remote, reads=wrong)
    frames = WINDOWS[1]
    window = open_window(f"s3://{BUCKET}/{name}", hint, frames)
    expected = decode_window(files / name, frames, hint=local, num_frames=300)
    got, requests, _ = counted(lambda: decode_window(f"s3://{BUCKET}/{name}", frames, hint=hint, num_frames=300))
    assert np.array_equal(got.frames, expected.frames)
    assert requests > 1 and window is not None
    expected_cut = cut_window(files / name, frames[0], frames[-1], local)
    cut = cut_window(f"s3://{BUCKET}/{name}", frames[0], frames[-1], hint)
    assert cut is None or packets(cut) == packets(expected_cut)


def test_an_object_replaced_by_a_shorter_one_fails_the_read_naming_it(store, files, tmp_path):
    from daliload.stream import RemoteReadError
    clear_header_cache()
    remote = hint_of(files / "vp9.webm")
    store.put_object(Bucket=BUCKET, Key="short.webm", Body=(files / "vp9.webm").read_bytes()[:20000])
    with pytest.raises(RemoteReadError, match=r"short\.webm.*shorter than when scanned"):
        open_window(f"s3://{BUCKET}/short.webm", remote, WINDOWS[2])


def test_a_window_read_ahead_is_taken_over_by_its_open_and_read_once(store, files):
    """What a worker does for the task behind the one it runs: the reads start at once, in a thread, and the
    task's own open takes them over (the same bytes, no second request)."""
    from daliload.stream import prefetch_window
    from daliload.stream._window import _ahead
    clear_header_cache()
    name, frames = "h264.mp4", WINDOWS[1]
    local, remote = hint_of(files / name, reads=False), hint_of(files / name)
    uri = f"s3://{BUCKET}/{name}"
    _, requests, _ = counted(lambda: prefetch_window(uri, remote, frames))
    assert len(_ahead) == 1
    got, more, _ = counted(lambda: decode_window(uri, frames, hint=remote, num_frames=300))
    assert not _ahead and np.array_equal(got.frames, decode_window(files / name, frames, hint=local).frames)
    assert 1 <= requests + more <= len(remote.reads.header()) + 1  # the prefetch's reads, counted once
    prefetch_window(files / name, remote, frames)  # a local file: nothing to read ahead
    assert not _ahead


def test_a_local_file_or_a_hint_without_index_is_read_as_before(files):
    remote = hint_of(files / "vp9.webm")
    assert open_window(files / "vp9.webm", remote, WINDOWS[1]) is None
    assert open_window(f"s3://{BUCKET}/vp9.webm", replace(remote, reads=None), WINDOWS[1]) is None


# -- through the loader -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_clips(tmp_path_factory):
    """A class-folder dataset of 300-frame clips with a keyframe every 16 (VP9 goes to DALI on the CPU, H.264 to
    the fallback), and the same packed into shards."""
    from daliload.commands.pack import pack_dataset

    root = tmp_path_factory.mktemp("long")
    for c, cls in enumerate(("archery", "bowling")):
        for i, codec in enumerate(("vp9", "h264", "vp9", "h264")):
            spec = default_spec(codec, gop=16)
            path = root / "train" / cls / f"clip{i}.{spec.extension}"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_video(path, render_clip(c, 300, width=160, height=120, seed=i), spec)
    shards = tmp_path_factory.mktemp("long-shards")
    pack_dataset(root, shards, progress=False)
    return root, shards


@pytest.mark.slow
def test_a_root_in_s3_reads_each_window_in_about_one_request_and_gives_the_local_batches(
        store, long_clips, tmp_path, monkeypatch):
    import torch

    from daliload.loader import DecodeSpec, KineticsDALILoader
    from daliload.plan import AugmentSpec, OutputSpec
    from helpers.s3_store import upload

    root, shards = long_clips
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the mirrors and their manifests
    upload(store, root, "long")
    upload(store, shards, "longshards")

    def run(where):
        loader = KineticsDALILoader(where, "train", batch_size=4, clip_len=16, frame_stride=4, device="cpu",
                                    augment=AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5),
                                    output=OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1)),
                                    decode=DecodeSpec(routing="static", dali_threads=1, fallback_workers=1))
        try:
            before = transfer_counts()
            batches = [(v.clone(), y.clone()) for v, y in loader]
            stats = loader.stats()
        finally:
            loader.close()
        return batches, stats, (stats.remote_requests - before.remote_requests,
                                stats.remote_bytes - before.remote_bytes)

    want, local, _ = run(root)
    assert local.clips_dali > 0 and local.clips_fallback > 0
    size = sum(p.stat().st_size for p in root.rglob("clip*"))
    for where in ("s3://long", "s3://longshards"):
        got, stats, (requests, received) = run(where)
        assert len(got) == len(want) and all(torch.equal(a, b) and torch.equal(s, t)
                                             for (a, s), (b, t) in zip(got, want)), where
        assert stats.failures == () and stats.clips_dali == local.clips_dali
        clips = stats.clips_dali + stats.clips_fallback
        # each file's header and its window at once (a window whose entry is frame 0: DALI reads the file
        # whole); without the byte index this epoch made 37 requests and read 0.82x the files (measured once)
        assert requests <= 3 * clips, (where, requests, clips)
        assert received < 0.6 * size, (where, received, size)


@pytest.mark.slow
def test_the_real_clips_from_s3_http_and_shards_give_the_local_batches_on_both_routes(
        store, realclips, tmp_path, monkeypatch):
    """The real clips of the test data (every container and codec they hold; the scan rejects the broken ones
    wherever they are read from) as a class-folder root: from a root in S3, from a manifest of HTTP URIs and
    from tar shards, the batches equal the local files', bit for bit, with DALI (VP9) and the fallback."""
    import shutil

    import torch

    from daliload.commands.pack import pack_dataset
    from daliload.loader import DecodeSpec, KineticsDALILoader
    from daliload.plan import AugmentSpec, OutputSpec
    from daliload.prescreen import ScanSpec
    from helpers.range_server import RangeServer
    from helpers.s3_store import upload, uri_manifest

    root = tmp_path / "real"
    for clip in sorted(realclips.rglob("*")):
        if clip.is_file() and clip.name != "MANIFEST.tsv":
            target = root / "train" / clip.parent.name / clip.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(clip, target)
    shards = tmp_path / "real-shards"
    pack_dataset(root, shards, progress=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    upload(store, root, "real")

    def run(where, **options):
        loader = KineticsDALILoader(where, "train", batch_size=3, clip_len=8, frame_stride=2, device="cpu",
                                    augment=AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5),
                                    output=OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1)),
                                    decode=DecodeSpec(routing="static", dali_threads=1, fallback_workers=1),
                                    **options)
        try:
            return [(v.clone(), y.clone()) for v, y in loader], loader.stats(), loader.manifest_path
        finally:
            loader.close()

    want, local, manifest = run(root)
    assert local.clips_dali > 0 and local.clips_fallback > 0
    with RangeServer(root) as server:
        http = uri_manifest(manifest, root, server.url(""), tmp_path / "http.sqlite")
        sources = [("s3://real", {}), (http, {"scan": ScanSpec(check=False)}), (shards, {})]
        for where, options in sources:
            got, stats, _ = run(where, **options)
            assert len(got) == len(want) and all(torch.equal(a, b) and torch.equal(s, t)
                                                 for (a, s), (b, t) in zip(got, want)), where
            assert (stats.clips_dali, stats.clips_fallback) == (local.clips_dali, local.clips_fallback), where
            assert len(stats.failures) == len(local.failures), where
