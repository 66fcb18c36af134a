"""README.md's first code block runs as a user saves it: only the dataset path and the epoch count are theirs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from daliload.synth import SynthSpec, generate_dataset

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_first_readme_snippet_runs_as_written(tmp_path):
    root = tmp_path / "kinetics"  # clips long enough for the snippet's 16 frames at stride 4
    generate_dataset(root, SynthSpec(num_classes=2, clips_per_class=3, val_fraction=0.0, width=128, height=96,
                                     duration_s=2.5, codec_mix={"h264": 0.5, "vp9": 0.5}, seed=4),
                     workers=2, progress=False)
    text = README.read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    for mine, theirs in (('"/data/kinetics700"', repr(str(root))), ("num_epochs = 30", "num_epochs = 2")):
        assert mine in code, mine
        code = code.replace(mine, theirs)
    script = tmp_path / "train.py"
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("epoch 1: "), proc.stdout  # the stats of the last of the two epochs
