"""Videos by URI: an S3 server (moto) and an HTTP server with Range support, both on 127.0.0.1.

The generated dataset is scanned locally, its files uploaded, and the
manifest's paths rewritten to URIs (scanning a remote root is not built yet:
``docs/remote.md``). Batches read from S3 and from HTTP equal the local ones
bit for bit, on both routes (on the CPU, VP9 goes to DALI and H.264 to the
fallback with ``routing="static"``); faults go through ``KineticsDALILoader``.

The S3 variables (dummy keys, ``AWS_ENDPOINT_URL``) are set for this module
only; multiprocessing's forkserver is stopped before and after, so that the
workers (the fallback's, the cutter's) start from a forkserver that has them,
and later tests from one that does not.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
import torch

from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.prescreen import ScanSpec
from daliload.stream import (ReadPolicy, RemoteReadError, SecretInURIError, open_video, read_video_file, redact,
                             transfer_counts)
from daliload.stream import _remote
from helpers.range_server import RangeServer
from helpers.s3_store import s3_server, upload, uri_manifest

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)
BUCKET = "kinetics"
UNCHECKED = ScanSpec(check=False)  # the manifest's sample check stats local files; these are remote


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on 127.0.0.1 and the variables that point the client at it (this module only)."""
    with s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def local(small_kinetics):
    """The local loader's manifest and batches (one epoch, both routes)."""
    loader = make_loader(small_kinetics)
    try:
        batches = epoch(loader)
        stats = loader.stats()
        manifest = Path(loader.manifest_path)
    finally:
        loader.close()
    assert stats.clips_dali > 0 and stats.clips_fallback > 0 and stats.failures == ()
    return manifest, batches


def make_loader(root, *, scan=None, **decode) -> KineticsDALILoader:
    return KineticsDALILoader(root, "train", batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              device="cpu", scan=scan, decode=DecodeSpec(routing="static", dali_threads=1,
                                                                         fallback_workers=1, **decode))


def epoch(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(videos.clone(), labels.clone()) for videos, labels in loader]


def reset_auth(endpoint: str, count: bytes) -> None:
    """moto's switch: requests after the first ``count`` must carry keys of its IAM (``inf``: none checked)."""
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count, method="POST",
                                     headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(request).close()


def same_batches(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(s, t) for (x, s), (y, t) in zip(a, b))


# -- addresses and redaction ----------------------------------------------------------------


def test_redact_hides_user_information_and_query_values_and_leaves_the_rest():
    assert redact("https://me:hunter2@host/a.mp4") == "https://***@host/a.mp4"
    assert (redact("https://b.s3.amazonaws.com/a.mp4?X-Amz-Signature=ab12&X-Amz-Expires=60")
            == "https://b.s3.amazonaws.com/a.mp4?X-Amz-Signature=***&X-Amz-Expires=***")
    for plain in ("s3://bucket/train/a.mp4", "/data/k/a b.mp4", "hf://datasets/x/y.mp4"):
        assert redact(plain) == plain
    from daliload.stream.errors import DecodeError

    assert str(DecodeError("https://me:hunter2@host/a.mp4", "no video stream")) == \
        "https://***@host/a.mp4: no video stream"


def test_a_local_file_uri_reads_the_file(small_kinetics):
    path = next(small_kinetics.rglob("*.webm"))
    assert read_video_file(path.as_uri()).tobytes() == path.read_bytes()
    assert open_video(path.as_uri()) == str(path)


def test_ranged_reads_fetch_only_the_bytes_asked_for(small_kinetics):
    path = next(small_kinetics.rglob("*.webm"))
    with RangeServer(small_kinetics) as server:
        url = server.url(path.relative_to(small_kinetics))
        before = transfer_counts()
        source = open_video(url)
        source.seek(1000)
        assert source.read(10) == path.read_bytes()[1000:1010]
        after = transfer_counts()
    assert after.remote_requests - before.remote_requests == 2  # its size, then one range
    assert after.remote_bytes - before.remote_bytes == min(path.stat().st_size - 1000, _remote.RANGE_BLOCK_BYTES)


def test_the_probe_reads_a_video_by_url_as_it_reads_the_file(small_kinetics):
    from dataclasses import replace

    from daliload.prescreen.probe import probe_file

    with RangeServer(small_kinetics) as server:
        for path in sorted(small_kinetics.rglob("train/*/*.*"))[:4]:
            remote = probe_file(server.url(path.relative_to(small_kinetics)))
            assert replace(remote, path=str(path)) == probe_file(path)


@pytest.mark.slow
def test_a_window_cut_over_http_reads_part_of_the_file_and_gives_the_same_packets(make_clip, tmp_path):
    """The cut seeks by the manifest's keyframes: a window late in the file costs its ranges, not the object."""
    import io

    import av

    from daliload.stream.cut import cut_window
    from daliload.stream.numbering import probe_hint

    path = make_clip(codec="vp9", num_frames=300, width=340, height=256, gop=16)
    hint = probe_hint(path)

    def packets(cut):
        with av.open(io.BytesIO(cut.data)) as container:  # Matroska's segment id is random: compare packets
            return cut.first_frame, [(p.pts, bytes(p)) for p in container.demux(video=0) if p.size]

    with RangeServer(path.parent) as server:
        before = transfer_counts()
        remote = cut_window(server.url(path.name), 230, 290, hint)
        after = transfer_counts()
    assert packets(remote) == packets(cut_window(path, 230, 290, hint))
    assert 0 < after.remote_bytes - before.remote_bytes < path.stat().st_size


def test_a_connection_cut_mid_body_is_retried_and_counted(small_kinetics):
    path = next(small_kinetics.rglob("*.webm"))
    with RangeServer(small_kinetics) as server:
        server.cut[path.name] = 1
        before = transfer_counts()
        data = read_video_file(server.url(path.relative_to(small_kinetics)))
        after = transfer_counts()
    assert data.tobytes() == path.read_bytes()
    assert (after.remote_requests - before.remote_requests, after.remote_retries - before.remote_retries) == (2, 1)


def test_a_store_failing_mid_file_raises_one_error_naming_the_url(small_kinetics, capfd):
    import av

    path = max(small_kinetics.rglob("*.webm"), key=lambda p: p.stat().st_size)
    with RangeServer(small_kinetics) as server:
        url = server.url(path.relative_to(small_kinetics))
        source = open_video(url, policy=ReadPolicy(attempts=2, backoff_s=0.01))
        source.block = 1024  # from the first read on: demuxing needs more requests after the open
        with av.open(source) as container:
            server.fail[path.name] = 100
            with pytest.raises(RemoteReadError, match=r"read failed in 2 request\(s\): .*503"):
                for _ in container.demux(video=0):
                    pass
    assert "exception being dropped" not in capfd.readouterr().err


# -- bit for bit --------------------------------------------------------------------------


@pytest.mark.slow
def test_batches_from_s3_and_http_equal_the_local_batches_on_both_routes(s3, local, small_kinetics, tmp_path):
    client, _ = s3
    manifest, expected = local
    upload(client, small_kinetics, BUCKET)
    from_s3 = uri_manifest(manifest, small_kinetics, f"s3://{BUCKET}/", tmp_path / "s3.sqlite")
    with RangeServer(small_kinetics) as server:
        from_http = uri_manifest(manifest, small_kinetics, server.url(""), tmp_path / "http.sqlite")
        for source, decode in ((from_s3, {}), (from_http, {}), (from_s3, {"dali_feed": "file"})):
            loader = make_loader(source, scan=UNCHECKED, **decode)
            try:
                assert all("://" in v.path for v in loader.videos)
                before = transfer_counts()
                batches = epoch(loader)
                stats = loader.stats()
            finally:
                loader.close()
            assert same_batches(batches, expected), (source.name, decode)
            assert stats.failures == () and stats.clips_dali > 0 and stats.clips_fallback > 0
            requests = stats.remote_requests - before.remote_requests
            received = stats.remote_bytes - before.remote_bytes
            if decode:  # DALI's whole-file reads: one request per file and batch; the fallback's workers' on top
                reads = [{s.path for s in batch if s.path.endswith(".webm")} for batch in loader.plan()]
                sizes = {v.path: (small_kinetics / v.path.split(f"{BUCKET}/", 1)[1]).stat().st_size
                         for v in loader.videos}
                assert requests > sum(map(len, reads)) and received > sum(sizes[p] for r in reads for p in r)
            else:  # the cuts' and the fallback's reads, made in worker processes, are counted here too
                assert requests > 0 and received > 0


@pytest.mark.slow
def test_the_fallback_workers_reads_are_counted_in_the_loaders_stats(local, small_kinetics, tmp_path):
    """Only the fallback decodes (in its worker processes): what they read comes back to stats()."""
    manifest, _ = local
    with RangeServer(small_kinetics) as server:
        source = uri_manifest(manifest, small_kinetics, server.url(""), tmp_path / "http.sqlite")
        loader = make_loader(source, decoder="fallback")
        try:
            before = transfer_counts()  # after construction: its one look-up per store is in it
            next(iter(loader))
            stats = loader.stats()
        finally:
            loader.close()
    assert stats.clips_fallback > 0 and stats.clips_dali == 0
    assert stats.remote_requests > before.remote_requests and stats.remote_bytes > before.remote_bytes


# -- faults -------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_object_deleted_after_the_scan_fails_its_sample_named_and_the_batch_keeps_its_size(
        s3, local, small_kinetics, tmp_path):
    client, _ = s3
    manifest, expected = local
    upload(client, small_kinetics, "deleted")
    source = uri_manifest(manifest, small_kinetics, "s3://deleted/", tmp_path / "m.sqlite")
    loader = make_loader(source, scan=UNCHECKED, max_failure_fraction=0.5)
    try:
        gone = {v.route: v.path for v in loader.videos}  # one of each route
        for uri in gone.values():
            client.delete_object(Bucket="deleted", Key=uri.split("deleted/", 1)[1])
        batches = epoch(loader)
        stats = loader.stats()
    finally:
        loader.close()
    assert [v.shape for v, _ in batches] == [v.shape for v, _ in expected]
    failed = {f.path: f for f in stats.failures}
    assert set(failed) == set(gone.values())
    assert all("not found" in f.describe() for f in failed.values()), [f.describe() for f in failed.values()]


@pytest.mark.slow
def test_a_server_answering_503_is_retried_counted_and_gives_the_same_batches(local, small_kinetics, tmp_path):
    manifest, expected = local
    with RangeServer(small_kinetics) as server:
        source = uri_manifest(manifest, small_kinetics, server.url(""), tmp_path / "m.sqlite")
        loader = make_loader(source, scan=UNCHECKED, dali_feed="file")  # DALI's reads: in this process, counted
        try:
            busy = next(v.path for v in loader.videos if v.route == "dali").rsplit("/", 1)[1]
            server.fail[busy] = 2
            before = transfer_counts()
            batches = epoch(loader)
            stats = loader.stats()
        finally:
            loader.close()
        assert server.fail[busy] == 0 and server.requests[busy] >= 3
    assert same_batches(batches, expected) and stats.failures == ()
    assert stats.remote_retries - before.remote_retries == 2


@pytest.mark.slow
def test_a_server_slower_than_the_time_limit_fails_the_sample_named_and_nothing_hangs(
        local, small_kinetics, tmp_path):
    manifest, expected = local
    slow, batches, stats, _ = _epoch_with_a_slow_file(manifest, small_kinetics, tmp_path, lambda videos: videos[0],
                                                      60.0, decoder="fallback", timeout_s=5.0)
    assert [v.shape for v, _ in batches] == [v.shape for v, _ in expected]
    (failure,) = stats.failures
    assert failure.path == slow and "did not answer in time" in failure.describe()


def _epoch_with_a_slow_file(manifest, root, tmp_path, pick, delay_s, **options):
    """An epoch of a loader over ``root`` served by HTTP, the file ``pick(videos)`` answering ``delay_s`` late;
    returns that file's URI, the batches, the loader's stats and the transfer counts before the epoch."""
    with RangeServer(root) as server:
        source = uri_manifest(manifest, root, server.url(""), tmp_path / "m.sqlite")
        loader = make_loader(source, scan=UNCHECKED, **options)
        try:
            slow = pick(loader.videos).path
            server.delay_s[slow.rsplit("/", 1)[1]] = delay_s
            before = transfer_counts()
            return slow, epoch(loader), loader.stats(), before
        finally:
            loader.close()


@pytest.mark.parametrize("decoder", ["fallback", "auto"])
def test_the_loaders_read_time_limit_and_attempts_apply_to_every_read(local, small_kinetics, tmp_path, decoder):
    """``DecodeSpec(read_timeout_s=, read_attempts=)``: a server 3 s slow for one file passes the default limit
    (20 s) but not 0.5 s, and with one attempt nothing is retried; on both routes (the fallback's workers, and the
    cutters' and DALI's reads of a VP9 file)."""
    manifest, expected = local
    slow, batches, stats, before = _epoch_with_a_slow_file(
        manifest, small_kinetics, tmp_path, lambda videos: next(v for v in videos if v.path.endswith(".webm")),
        3.0, decoder=decoder, read_timeout_s=0.5, read_attempts=1)
    assert [v.shape for v, _ in batches] == [v.shape for v, _ in expected]
    (failure,) = stats.failures
    assert failure.path == slow
    assert stats.remote_retries == before.remote_retries and stats.remote_failed_reads > before.remote_failed_reads


@pytest.mark.parametrize("field, value, message", [("read_timeout_s", 0, "read_timeout_s must be > 0 seconds"),
                                                   ("read_attempts", 0, "read_attempts must be an integer >= 1"),
                                                   ("read_attempts", 1.5, "read_attempts must be an integer >= 1")])
def test_bad_read_settings_are_refused_naming_them(field, value, message):
    with pytest.raises(ValueError, match=message):
        DecodeSpec(**{field: value})
    assert DecodeSpec(read_timeout_s=3, read_attempts=2).read_policy == ReadPolicy(timeout_s=3, attempts=2)


def test_a_bucket_that_does_not_exist_is_one_error_at_construction(s3, local, small_kinetics, tmp_path):
    manifest, _ = local
    source = uri_manifest(manifest, small_kinetics, "s3://no-such-bucket/", tmp_path / "m.sqlite")
    with pytest.raises(RemoteReadError, match=r"s3://no-such-bucket/.*bucket does not exist.*AWS_ENDPOINT_URL"):
        make_loader(source, scan=UNCHECKED)


def test_credentials_the_store_refuses_are_one_error_at_construction(s3, local, small_kinetics, tmp_path):
    client, endpoint = s3
    manifest, _ = local
    upload(client, small_kinetics, "locked")
    source = uri_manifest(manifest, small_kinetics, "s3://locked/", tmp_path / "m.sqlite")
    reset_auth(endpoint, b"0")
    try:  # moto now checks every request's keys: the dummy ones are not in its IAM
        with pytest.raises(RemoteReadError, match=r"s3://locked/.*refused the credentials.*AWS_ACCESS_KEY_ID"):
            make_loader(source, scan=UNCHECKED)
    finally:
        reset_auth(endpoint, b"inf")


def test_a_uri_with_a_secret_is_refused_and_shown_redacted(local, small_kinetics, tmp_path):
    manifest, _ = local
    source = uri_manifest(manifest, small_kinetics, "https://user:hunter2@127.0.0.1:9/", tmp_path / "m.sqlite")
    with pytest.raises(SecretInURIError, match=r"https://\*\*\*@127\.0\.0\.1:9/.*standard configuration") as err:
        make_loader(source, scan=UNCHECKED)
    assert "hunter2" not in str(err.value)
    with pytest.raises(RemoteReadError, match=r"X-Amz-Signature=\*\*\*") as err:
        read_video_file("https://127.0.0.1:9/a.webm?X-Amz-Signature=c0ffee", policy=ReadPolicy(attempts=1))
    assert "c0ffee" not in str(err.value)
