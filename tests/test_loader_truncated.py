"""A file that decodes fewer frames now than the manifest says: a failed sample, never a padded clip.

Driven through :class:`~daliload.KineticsDALILoader`. The dataset mixes 60-frame files (30 fps, 2 s),
whose 36-frame windows fit, with 30-frame ones (15 fps), whose windows the plan knowingly lets run past
the manifest's count: those clips repeat frame 29 and are counted in ``stats().clips_past_end``. After the
scan, one file of each route is cut short:

- a fallback-route H.264 file of 30 frames, now 12 (its window legitimately ran past frame 29, but the
  padding must be frame 29, which is gone): the fallback is fed it directly;
- a DALI-route VP9 file of 60 frames, truncated mid-stream: DALI fails its batch, the fallback decodes
  it again.

Each must fail (replaced, named in ``stats().failures`` with "decoded only N of M frames"), not give a clip
of repeats of its last frame that still decodes. Every other row shows exactly its sample's frames, the edge
rule applied with the manifest's count.
"""

from __future__ import annotations

import re
import shutil
from fractions import Fraction
from pathlib import Path

import av
import pytest

from daliload.failures import DecodeFailureWarning
from daliload.framecode import read_code
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, CropBox, OutputSpec, Sample
from daliload.synth import SynthSpec, default_spec, generate_dataset, write_video
from fallback.decode import DecodeError, decode_window
from fallback.views import decode_views

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)
CLIP_LEN, FRAME_STRIDE = 8, 5  # a 36-frame span: inside a 60-frame file, past the end of a 30-frame one


@pytest.fixture(scope="module")
def short_and_long(tmp_path_factory) -> Path:
    """16 train files, 128x96, 2 s: H.264 and VP9, each at 30 fps (60 frames) and 15 fps (30 frames)."""
    root = tmp_path_factory.mktemp("short_and_long")
    spec = SynthSpec(num_classes=2, clips_per_class=8, val_fraction=0.0, width=128, height=96, duration_s=2.0,
                     fps_mix={Fraction(30): 0.5, Fraction(15): 0.5}, codec_mix={"h264": 0.5, "vp9": 0.5}, seed=3)
    generate_dataset(root, spec, workers=2, progress=False)
    return root


@pytest.fixture
def root(short_and_long, tmp_path) -> Path:
    """A private copy (the test cuts its files), scanned on first use."""
    copy = tmp_path / "data"
    shutil.copytree(short_and_long, copy, ignore=shutil.ignore_patterns(".daliload"))
    return copy


def decodable_frames(path: str) -> int:
    """Frames a full decode of ``path`` gives now (0 when it cannot be opened)."""
    try:
        with av.open(path) as container:
            return sum(1 for _ in container.decode(video=0))
    except av.error.FFmpegError:
        return 0


def keep_first_frames(path: str, keep: int, fps: int) -> None:
    """Rewrite the H.264 file ``path`` with only its first ``keep`` frames (a download cut short, saved again).

    Truncating an MP4's bytes would lose its index (written last) and leave nothing to decode at all; the
    case here is a file that opens and decodes, only shorter than when it was scanned.
    """
    with av.open(path) as container:
        frames = [frame.to_ndarray(format="rgb24") for _, frame in zip(range(keep), container.decode(video=0))]
    write_video(path, frames, default_spec("h264", fps=Fraction(fps)))


def cut_bytes_before_frame(path: str, frame: int) -> None:
    """Truncate the WebM ``path`` at the packet of frame ``frame``: the frames before it still decode."""
    with av.open(path) as container:
        positions = [p.pos for p in container.demux(video=0) if p.size]
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: positions[frame]])


def test_a_file_shorter_now_than_its_scan_fails_its_sample_on_both_routes(root):
    loader = KineticsDALILoader(root, "train", batch_size=4, clip_len=CLIP_LEN, frame_stride=FRAME_STRIDE,
                                augment=WHOLE, output=RAW,
                                decode=DecodeSpec(max_failure_fraction=1.0, routing="static"))
    manifest = {v.path: v for v in loader.videos}
    frames = {path: v.num_frames for path, v in manifest.items()}
    assert sorted(set(frames.values())) == [30, 60]

    def pick(route: str, num_frames: int) -> list[str]:
        return sorted(p for p, v in manifest.items() if v.route == route and v.num_frames == num_frames)

    fallback_victim, dali_victim = pick("fallback", 30)[0], pick("dali", 60)[0]
    # Untouched short files of both routes: their clips run past the end the plan's way.
    assert pick("fallback", 30)[1:] and pick("dali", 30)
    keep_first_frames(fallback_victim, 12, fps=15)
    cut_bytes_before_frame(dali_victim, 20)
    now = {fallback_victim: decodable_frames(fallback_victim), dali_victim: decodable_frames(dali_victim)}
    assert now[fallback_victim] == 12 and 0 < now[dali_victim] <= 20

    with pytest.warns(DecodeFailureWarning):
        batches = [(v.clone(), lab.clone()) for v, lab in loader]

    stats = loader.stats()
    failed = {f.path: f for f in stats.failures}
    assert set(failed) == {fallback_victim, dali_victim}, stats.format()
    for path, total in ((fallback_victim, 30), (dali_victim, 60)):
        assert re.search(rf"decoded only {now[path]} of {total} frames", failed[path].reason), failed[path]
        assert "since the scan" in failed[path].reason
        assert failed[path].describe().startswith(path)
    assert stats.rerouted == (dali_victim,)  # DALI failed on it first; the fallback's decode failed too
    plan = loader.plan()
    victim_slots = {s.position for b in plan for s in b if s.path in failed}
    assert {slot for slot, _ in stats.replacements} == victim_slots and stats.replaced == len(victim_slots)
    # The legitimate padding still works, and is counted: every planned window past the manifest's count.
    assert stats.clips_past_end == sum(s.last_frame >= frames[s.path] for b in plan for s in b) > len(victim_slots)

    used = dict(stats.replacements)
    by_position = {s.position: s for b in plan for s in b}
    assert len(batches) == len(plan)
    for (videos, labels), batch in zip(batches, plan):
        assert videos.shape[0] == len(batch)
        for k, slot in enumerate(batch):
            sample = by_position[used.get(slot.position, slot.position)]
            assert sample.path not in failed
            clip = videos[k]
            codes = [read_code(clip[:, t], layout="CHW") for t in range(clip.shape[1])]
            assert [c.index for c in codes] == sample.frame_indices(frames[sample.path]), sample.path
            assert int(labels[k]) == sample.label


def test_decode_window_fails_a_window_the_file_no_longer_has_and_pads_past_the_scans_count(make_clip, tmp_path):
    """The rule itself, on the fallback's decoder: the scan's count decides what is padding."""
    full = str(make_clip("vp9", num_frames=60))
    cut = str(tmp_path / "cut.webm")
    shutil.copy(full, cut)
    cut_bytes_before_frame(cut, 36)
    left = decodable_frames(cut)
    assert 0 < left <= 36
    with pytest.raises(DecodeError, match=rf"cut\.webm: decoded only {left} of 60 frames: truncated or replaced "
                                          rf"since the scan \(the window needs frame 59\)"):
        decode_window(cut, range(50, 65, 2), num_frames=60)  # 60, 62, 64: the plan's padding
    # The same window past the scan's own count (the plan's padding), and one the cut file still has.
    padded = decode_window(full, [40, 50, 60, 70], num_frames=60)
    assert [read_code(f).index for f in padded.frames] == [40, 50, 59, 59]
    assert [read_code(f).index for f in decode_window(cut, [0, 10], num_frames=60).frames] == [0, 10]
    # Several views of the file in one decode: one that needs a lost frame fails them all.
    views = [Sample(position=0, video_index=0, path=cut, label=1, start_frame=start, frame_stride=2, clip_len=4,
                    crop=CropBox(0.0, 0.0, 1.0, 1.0), view=view) for view, start in enumerate((0, 40))]
    with pytest.raises(DecodeError, match=rf"decoded only {left} of 60 frames"):
        decode_views(views, RAW, num_frames=60)
