"""What the first GPU run depends on, checked on the CPU: NVDEC's limits per GPU model in the routes,
and no host synchronisation per batch."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from daliload import cli, epoch
from daliload.dali import _source as dali_source
from daliload.epoch import HeldOutputs
from daliload.loader import DecodeSpec
from daliload.prescreen import probe_file, route_for
from daliload.prescreen.gpus import AV1_GENERATIONS, GENERATIONS, GPU_MODELS, model_from_name, resolve_gpu
from daliload.prescreen.probe import ProbeResult


def test_a_clip_under_nvdecs_minimum_size_goes_to_the_fallback_on_a_gpu(make_clip):
    """NVDEC decodes VP9 from 128x128: a 128x96 VP9 (the CPU tests' size) must not reach it."""
    small = probe_file(make_clip(codec="vp9", num_frames=20, width=128, height=96))
    large = probe_file(make_clip(codec="vp9", num_frames=20, width=192, height=144))
    route, reason = route_for(small, "gpu")
    assert route == "fallback" and "128x96" in reason and "128x128" in reason, reason
    assert route_for(large, "gpu") == ("dali", "")
    assert route_for(small, "cpu") == ("dali", "")  # DALI's CPU decoder has no such minimum


class FakeEvent:
    """Stands in for torch.cuda.Event: completes when the test says so; counts host waits."""

    waits = 0

    def __init__(self) -> None:
        self.done = False
        self.stream = None

    def record(self, stream) -> None:
        self.stream = stream

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        FakeEvent.waits += 1
        self.done = True


def test_dali_outputs_are_held_until_their_copies_ran_without_a_host_wait():
    FakeEvent.waits = 0
    events: list[FakeEvent] = []

    def new_event() -> FakeEvent:
        events.append(FakeEvent())
        return events[-1]

    held = HeldOutputs(new_event)
    held.hold("batch 0 outputs", stream="s")
    held.hold("batch 1 outputs", stream="s")
    assert len(held) == 2 and events[0].stream == "s"  # recorded on the stream that copies
    events[0].done = True  # the GPU ran batch 0's copies
    held.hold("batch 2 outputs", stream="s")
    assert len(held) == 2  # batch 0 let go, 1 and 2 still read by pending copies
    assert FakeEvent.waits == 0  # never waited for the GPU while batches flow
    held.release_all()  # the end of a pass waits for what is left
    assert len(held) == 0 and FakeEvent.waits == 2


def test_the_merge_has_no_per_batch_host_synchronisation():
    """Code-level check: in the epoch pass and the DALI source only the end of a pass and the failure path
    wait for the GPU."""
    files = [*Path(epoch.__file__).parent.glob("*.py"), Path(dali_source.__file__)]  # the pass's modules, DALI's source
    trees = [ast.parse(path.read_text()) for path in files]
    waiting = set()
    for function in (n for tree in trees for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Attribute) and call.func.attr == "synchronize":
                waiting.add(function.name)
    assert waiting == {"release_all", "_copied"}  # _copied: only while isolating a failed DALI batch


# --- routes per GPU model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def av1_dataset(tmp_path_factory, make_clip) -> Path:
    """A class folder with an 8-bit 4:2:0 AV1 clip and an H.264 MP4, at sizes NVDEC decodes."""
    root = tmp_path_factory.mktemp("av1_data")
    folder = root / "train" / "a"
    folder.mkdir(parents=True)
    shutil.copy(make_clip(codec="av1", num_frames=20, width=192, height=144), folder / "clip_av1.mp4")
    shutil.copy(make_clip(codec="h264", num_frames=20, width=192, height=144), folder / "clip_h264.mp4")
    return root


def scan_json(root: Path, tmp_path: Path, *args: str) -> dict[str, dict]:
    out = tmp_path / "scan.json"
    assert cli.main(["scan", str(root), "--split", "train", "--quiet", "--json", str(out), *args]) == 0
    return {Path(item["path"]).name: item for item in json.loads(out.read_text())}


def test_scan_for_an_h200_sends_av1_to_the_fallback_naming_the_gpu_and_for_an_l40s_to_dali(
        av1_dataset, tmp_path, capsys):
    hopper = scan_json(av1_dataset, tmp_path, "--device", "gpu", "--gpu-model", "H200")
    assert hopper["clip_av1.mp4"]["route"] == "fallback"
    assert "no av1 decoder" in hopper["clip_av1.mp4"]["reason"] and "H200" in hopper["clip_av1.mp4"]["reason"]
    assert hopper["clip_av1.mp4"]["routed_for"].startswith("gpu:hopper: H200 (NVDEC hopper, no AV1)")
    assert hopper["clip_h264.mp4"]["route"] == "dali"
    assert "routes decided for GPU: H200 (NVDEC hopper, no AV1)" in capsys.readouterr().out
    # Another GPU, the same manifest: routed from the stored facts, nothing probed again.
    ada = scan_json(av1_dataset, tmp_path, "--device", "gpu", "--gpu-model", "L40S")
    assert ada["clip_av1.mp4"]["route"] == "dali" and ada["clip_av1.mp4"]["routed_for"].startswith("gpu:ada")
    assert "0 probed" in capsys.readouterr().out


def test_without_a_gpu_or_a_model_the_scan_assumes_no_av1_and_says_so(av1_dataset, tmp_path, capsys):
    routes = scan_json(av1_dataset, tmp_path, "--device", "gpu")
    assert routes["clip_av1.mp4"]["route"] == "fallback"
    out = capsys.readouterr().out
    assert "assumed" in out and "no AV1" in out


def test_a_gpu_model_needs_the_gpu_device_and_a_known_name(av1_dataset, tmp_path, capsys):
    assert cli.main(["scan", str(av1_dataset), "--device", "cpu", "--gpu-model", "H200", "--quiet"]) == 2
    assert "--gpu-model H200 needs --device gpu" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"unknown GPU model 'Z9000'; known models: .*H200"):
        resolve_gpu("Z9000")
    assert cli.main(["scan", str(av1_dataset), "--device", "gpu", "--gpu-model", "Z9000", "--quiet"]) == 2
    assert "daliload scan: unknown GPU model 'Z9000'; known models:" in capsys.readouterr().err
    with pytest.raises(ValueError, match="dali_pipelines must be an integer >= 1, got 0"):
        DecodeSpec(dali_pipelines=0)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_every_generation_routes_av1_by_its_nvdec_and_annex_b_h264_to_the_fallback(generation):
    av1 = ProbeResult("a.mp4", has_video=True, codec="av1", width=192, height=144, bit_depth=8, chroma="420",
                      container="mov,mp4,m4a,3gp,3g2,mj2", num_frames=20, num_packets=20)
    h264_mp4 = dataclasses.replace(av1, codec="h264")
    h264_ts = dataclasses.replace(h264_mp4, container="mpegts")
    target = f"gpu:{generation}"
    assert route_for(av1, target)[0] == ("dali" if generation in AV1_GENERATIONS else "fallback")
    assert route_for(h264_mp4, target) == ("dali", "")
    route, reason = route_for(h264_ts, target)
    assert route == "fallback" and "length-prefixed" in reason and "mpegts" in reason
    assert route_for(av1, "cpu")[0] == "fallback"  # DALI's CPU build has no AV1


@pytest.mark.parametrize(("reported", "model", "generation"), [
    ("NVIDIA H200", "H200", "hopper"), ("NVIDIA A100-SXM4-80GB", "A100", "ga100"),
    ("NVIDIA GH200 480GB", "GH200", "hopper"), ("NVIDIA L40S", "L40S", "ada"), ("NVIDIA L4", "L4", "ada"),
    ("NVIDIA GeForce RTX 4090", "RTX4090", "ada"), ("NVIDIA B200", "B200", "blackwell"),
    ("Tesla T4", "T4", "turing"), ("NVIDIA A10G", "A10G", "ga10x"),
])
def test_gpu_names_map_to_their_nvdec_generation(reported, model, generation):
    assert model_from_name(reported) == model and GPU_MODELS[model] == generation
    assert resolve_gpu(reported).route_target == f"gpu:{generation}"


def test_on_a_gpu_host_each_class_is_confirmed_once_by_a_test_decode(av1_dataset, tmp_path, monkeypatch, capsys):
    """The table says an L40S decodes AV1; a test decode on the GPU that fails overrides it, once per class."""
    import sys

    from daliload.prescreen import confirm

    scan_mod = sys.modules["daliload.prescreen.scan"]  # the package's `scan` attribute is the function

    calls = []

    def fake_check(entry, device, *, device_id=0):
        calls.append(entry.codec)
        return "Failed to create video decoder" if entry.codec == "av1" else ""

    monkeypatch.setattr(scan_mod, "gpu_visible", lambda: True)
    # The stand-in replaces the worker's decode (the real path is the next test).
    monkeypatch.setattr(confirm, "_isolated_checks",
                        lambda examples, device_id: {key: fake_check(e, "gpu") for key, e in examples.items()})
    root = tmp_path / "data"  # its own manifest: the verdicts it caches must not reach other tests
    shutil.copytree(av1_dataset, root, ignore=shutil.ignore_patterns(".daliload"))
    routes = scan_json(root, tmp_path, "--device", "gpu", "--gpu-model", "L40S")
    assert sorted(calls) == ["av1", "h264"]
    assert routes["clip_av1.mp4"]["route"] == "fallback"
    assert routes["clip_av1.mp4"]["reason"].startswith("a test decode of a av1/")
    assert routes["clip_h264.mp4"]["route"] == "dali"
    assert "confirmed by a test decode on this GPU" in capsys.readouterr().out
    scan_json(root, tmp_path, "--device", "gpu", "--gpu-model", "L40S")
    assert len(calls) == 2  # cached in the manifest per GPU generation: not decoded again
    b200 = scan_json(root, tmp_path, "--device", "gpu", "--gpu-model", "B200")
    assert len(calls) == 4 and b200["clip_av1.mp4"]["route"] == "fallback"  # another generation: its own test


def test_the_test_decodes_run_in_a_supervised_worker(av1_dataset, tmp_path):
    """The real path (no stand-in): DALI's test decode runs in one worker process and its outcome comes back.

    Without a GPU, DALI refuses to build a GPU pipeline: the class gets that error, and nothing crashes here.
    """
    import torch

    from daliload.prescreen import Manifest, confirm
    from daliload.prescreen.rules import nvdec_class

    scan_json(av1_dataset, tmp_path, "--device", "gpu", "--gpu-model", "L40S")
    with Manifest(av1_dataset / ".daliload" / "manifest.sqlite") as manifest:
        entry = next(e for e in manifest.entries(None, device="gpu:ada") if e.route == "dali")
    result = confirm._isolated_checks({nvdec_class(entry): entry}, 0)
    assert list(result) == [nvdec_class(entry)]
    if torch.cuda.is_available():
        assert result[nvdec_class(entry)] == ""
    else:
        assert "CUDA is not available" in result[nvdec_class(entry)]


@pytest.mark.cuda
@pytest.mark.dali
def test_av1_on_this_gpu_decodes_as_the_nvdec_table_says(make_clip):
    """The table's AV1 entry for the GPU this runs on, settled by decoding an AV1 file with DALI on NVDEC.

    Hopper (H100, H200) is listed without AV1 from NVIDIA's application note and no decode had tried it:
    on the first GPU visit this test decodes one. A table that is wrong fails here, naming the generation.
    """
    pytest.importorskip("nvidia.dali")
    from daliload.framecode import read_clip
    from daliload.dali import DaliBatchError, DaliClipDecoder
    from daliload.plan import CropBox, OutputSpec, Sample
    from daliload.prescreen.gpus import detect_gpu

    target = detect_gpu()
    av1 = make_clip(codec="av1", num_frames=40, width=192, height=144)
    samples = [Sample(position=0, video_index=0, path=str(av1), label=0, start_frame=5, frame_stride=2, clip_len=8,
                      crop=CropBox.full())]
    raw = OutputSpec(size=(144, 192), mean=(0, 0, 0), std=(1, 1, 1), dtype="float32", layout="CTHW")
    with DaliClipDecoder(raw, batch_size=1, device="gpu", num_threads=2) as decoder:
        try:
            frames = read_clip(decoder.decode_batch(samples, timeout_s=120).videos[0].cpu(), layout="CTHW")
            outcome = "decodes AV1" if frames == samples[0].frame_indices(40) else f"decodes wrong frames {frames}"
        except DaliBatchError as err:
            outcome = f"does not decode AV1 ({err.reason})"
    table = "decodes AV1" if target.decodes_av1 else "does not decode AV1"
    assert outcome.startswith(table), (f"{target.describe()}: the NVDEC table says it {table}, DALI on this GPU "
                                       f"{outcome}: change AV1_GENERATIONS in daliload/prescreen/gpus.py")


# --- DALI pipelines per NVDEC engine (dali_pipelines="auto") ----------------------------------------------


def test_auto_pipelines_are_one_per_nvdec_engine_of_the_gpu_model_and_stay_overridable():
    """Provisional until the first GPU visit's sweep: one pipeline kept about one engine busy (DALI issue 6387)."""
    from daliload.prescreen.gpus import NVDEC_ENGINES

    assert DecodeSpec().dali_pipelines == "auto"
    assert (resolve_gpu("H200").nvdec_engines, resolve_gpu("NVIDIA A100-SXM4-80GB").nvdec_engines) == (7, 5)
    assert resolve_gpu("RTX 4090").nvdec_engines is None  # a model whose engines are not listed
    assert resolve_gpu("hopper").nvdec_engines is None and resolve_gpu(None).nvdec_engines is None  # no model
    assert set(NVDEC_ENGINES) <= set(GPU_MODELS)
    auto = DecodeSpec()
    assert [auto.dali_pipelines_for("gpu", 7), auto.dali_pipelines_for("gpu", None), auto.dali_pipelines_for("cpu", 7)
            ] == [7, 1, 1]
    assert DecodeSpec(dali_pipelines=3).dali_pipelines_for("gpu", 7) == 3
    # Every pipeline has a batch in flight: the prefetch follows the pipelines the loader resolved.
    assert auto.batches_ahead(32, pipelines=7) == 7 and auto.batches_ahead(32) == 2
    with pytest.raises(ValueError, match=r"dali_pipelines must be an integer >= 1, got 'many'; or 'auto'"):
        DecodeSpec(dali_pipelines="many")
