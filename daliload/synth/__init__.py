"""Generated Kinetics-like data: clips with learnable motion and a frame-index code."""

from daliload.synth.content import MOTIONS, motion_of, render_clip
from daliload.synth.dataset import SynthReport, generate_dataset
from daliload.synth.encode import CODEC_PRESETS, EncodeSpec, default_spec, write_video
from daliload.synth.spec import SynthSpec

__all__ = ["MOTIONS", "motion_of", "render_clip", "CODEC_PRESETS", "EncodeSpec", "default_spec",
           "write_video",
           "SynthReport", "SynthSpec", "generate_dataset"]
