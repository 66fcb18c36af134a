"""``daliload transcode``: re-encode a raw Kinetics download into a dataset every decoder handles fast.

H.264 High, 8-bit 4:2:0, progressive, in MP4, a keyframe every ``gop`` frames,
short side ``short_side``; same layout as the source; safe to kill and re-run.
Modules: :mod:`.options` (what to encode, shares, encoder choice), :mod:`.plan`
(which files, layout files), :mod:`.encode` (one file, in a worker),
:mod:`.record` (what is done), :mod:`.run` (the supervised run), :mod:`.cli`.
"""

from daliload.transcode.encode import FileJob, TranscodeError, output_size, transcode_file
from daliload.transcode.options import Shard, TranscodeOptions, parse_fps, parse_shard, resolve_encoder
from daliload.transcode.plan import TranscodePlan, plan_transcode, rewrite_list
from daliload.transcode.record import Record, record_path
from daliload.transcode.run import DEFAULT_TIMEOUT_S, transcode_dataset
from daliload.transcode.summary import FileResult, TranscodeSummary

__all__ = ["FileJob", "TranscodeError", "output_size", "transcode_file", "Shard", "TranscodeOptions", "parse_fps",
           "parse_shard", "resolve_encoder", "TranscodePlan", "plan_transcode", "rewrite_list", "Record",
           "record_path", "DEFAULT_TIMEOUT_S", "transcode_dataset", "FileResult", "TranscodeSummary"]
