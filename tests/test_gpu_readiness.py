"""What the first GPU run depends on, checked on the CPU: NVDEC's limits in the routes, no host sync."""

from __future__ import annotations

import ast
from pathlib import Path

from daliload import epoch
from daliload.epoch import HeldOutputs
from daliload.prescreen import probe_file, route_for


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
    """Code-level check: in the epoch pass only the end of a pass and the failure path wait for the GPU."""
    tree = ast.parse(Path(epoch.__file__).read_text())
    waiting = set()
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Attribute) and call.func.attr == "synchronize":
                waiting.add(function.name)
    assert waiting == {"release_all", "_copied"}  # _copied: only while isolating a failed DALI batch
