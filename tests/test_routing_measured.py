"""Routing by measured speed through ``KineticsDALILoader(device="cpu")``: VP9 (route ``dali`` on the CPU,
DALI's CPU decoder) with the default routing, one decoder slowed by a fixed delay per clip
(:func:`daliload.testing.slow_decoder`).

No time is asserted: which decoder took the clips (``stats().decoders``, the clip counts), and that every
clip is still the plan's (frame code painted into every generated frame). The policy's schedule on a
virtual clock is ``tests/test_routing_speed.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from daliload.framecode import read_code
from daliload.loader import DecodeSpec, KineticsDALILoader
from daliload.plan import AugmentSpec, OutputSpec
from daliload.synth import SynthSpec, generate_dataset
from daliload.testing import slow_decoder

pytestmark = pytest.mark.slow

RAW = OutputSpec(size=(48, 64), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32")
WHOLE = AugmentSpec(crop_size=(48, 64), crop_mode="center", flip_prob=0.5)
#: seconds a clip on the slowed decoder: several times what either takes for these small clips
SLOW_S = 0.1


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name, mix in (("vp9", {"vp9": 1.0}), ("mixed", {"vp9": 0.5, "h264": 0.5})):
        root = tmp_path_factory.mktemp(name)
        generate_dataset(root, SynthSpec(num_classes=4, clips_per_class=12, val_fraction=0.15, width=128, height=96,
                                         duration_s=2.0, codec_mix=mix, seed=7), workers=2, progress=False)
        out[name] = root
    return out


def make_loader(root, split: str = "train", **decode) -> KineticsDALILoader:
    return KineticsDALILoader(root, split, batch_size=4, clip_len=6, frame_stride=3, augment=WHOLE, output=RAW,
                              device="cpu", decode=DecodeSpec(**decode))


def epoch(loader) -> tuple[int, int]:
    """One pass, every clip checked against the plan (frames, flip, label); ``(clips_dali, clips_fallback)``."""
    frames = {v.path: v.num_frames for v in loader.videos}
    got = [(v.clone(), lab.clone()) for v, lab in loader]
    plan = loader.plan()
    assert len(got) == len(plan) == len(loader) == loader.stats().batches
    for (videos, labels), batch in zip(got, plan):
        assert len(labels) == len(batch)
        for k, sample in enumerate(batch):
            codes = [read_code(videos[k][:, t], layout="CHW") for t in range(videos.shape[2])]
            assert [c.index for c in codes] == sample.frame_indices(frames[sample.path])
            assert all(c.flipped == sample.flip for c in codes)
            assert int(labels[k]) == sample.label
    stats = loader.stats()
    assert stats.failures == ()
    return stats.clips_dali, stats.clips_fallback


def vp9(loader):
    (route,) = [r for r in loader.stats().decoders if r.codec == "vp9"]
    return route


def until_settled(loader, decoder: str, epochs: int = 8) -> int:
    """Epochs run until one in which ``decoder`` took every clip (at most ``epochs``)."""
    for n in range(1, epochs + 1):
        dali, fallback = epoch(loader)
        if (dali if decoder == "dali" else fallback) == dali + fallback:
            return n
    return epochs + 1


def test_the_default_follows_the_faster_decoder_and_follows_a_change(roots):
    loader = make_loader(roots["vp9"])
    try:
        assert loader.stats().routing == "measured" and {v.route for v in loader.videos} == {"dali"}
        assert len(loader) >= 8
        dali = slow_decoder(loader, "dali", SLOW_S)
        # DALI slowed: measured on DALI (the table's), the fallback tried, then the fallback takes VP9
        settled = until_settled(loader, "fallback")
        print(f"DALI slowed: the fallback took every clip from epoch {settled}: {vp9(loader).describe()}")
        assert settled <= 4
        route = vp9(loader)
        assert (route.decoder, route.why) == ("fallback", "measured")
        assert route.rates["fallback"] > route.rates["dali"]
        assert "vp9: fallback (measured" in loader.stats().format()
        # the speeds swap: the fallback's measurement falls, DALI is tried again and takes VP9 back
        dali.seconds_per_clip = 0.0
        slow_decoder(loader, "fallback", SLOW_S)
        settled = until_settled(loader, "dali")
        print(f"then the fallback slowed: DALI took every clip from epoch {settled}: {vp9(loader).describe()}")
        assert settled <= 4
        route = vp9(loader)
        assert (route.decoder, route.why) == ("dali", "measured") and route.trials >= 2
        assert route.clips["dali"] > 0 and route.clips["fallback"] > 0
    finally:
        loader.close()


@pytest.mark.parametrize("decode, decoder", [(dict(routing="static"), "dali"),
                                             (dict(decoder="fallback"), "fallback")])
def test_an_explicit_choice_wins_over_the_measured_speed(roots, decode, decoder):
    loader = make_loader(roots["vp9"], **decode)
    try:
        slow_decoder(loader, decoder, SLOW_S)  # the user's choice is the slower one: it still takes every clip
        for _ in range(2):
            dali, fallback = epoch(loader)
            assert (dali if decoder == "dali" else fallback) == dali + fallback
        route = vp9(loader)
        assert (route.decoder, route.why) == (decoder, "explicit")
        assert route.detail == ("routing='static'" if decoder == "dali" else "decoder='fallback'")
    finally:
        loader.close()


def test_codecs_only_the_fallback_decodes_say_so_and_never_reach_dali(roots):
    loader = make_loader(roots["mixed"])
    try:
        slow_decoder(loader, "fallback", SLOW_S)  # the fallback slower: VP9 stays on DALI, H.264 cannot
        on_dali = {v.path for v in loader.videos if v.route == "dali"}
        for _ in range(3):
            dali, _ = epoch(loader)
            assert dali <= sum(s.path in on_dali for b in loader.plan() for s in b)
        by_codec = {r.codec: r for r in loader.stats().decoders}
        assert (by_codec["h264"].decoder, by_codec["h264"].why) == ("fallback", "only decoder able")
        assert by_codec["h264"].clips["dali"] == 0 and by_codec["h264"].clips["fallback"] > 0
        assert (by_codec["vp9"].decoder, by_codec["vp9"].why) == ("dali", "measured")
    finally:
        loader.close()


def test_an_evaluation_split_keeps_the_table_by_default(roots):
    """Validation figures come out the same on every run: no measured routing there."""
    loader = make_loader(roots["vp9"], split="val")
    try:
        epoch(loader)
        assert loader.stats().routing == "static"
        route = vp9(loader)
        assert (route.decoder, route.why) == ("dali", "default")
    finally:
        loader.close()
