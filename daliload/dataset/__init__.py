"""The dataset: which files a split holds (its index), the videos a loader keeps (as columns), a machine's share.

Modules, by concept:

* :mod:`._index`: :func:`load_index`, the split's files and labels in any
  layout of the registry, and class maps (:func:`save_classes`, :func:`load_classes`);
* :mod:`._registry`: the registry of layouts (:data:`LAYOUTS`, one
  :class:`DatasetLayout` each: how a split is found, read and transcoded);
  the Kinetics three are drawn in :mod:`._index`, UCF101, HMDB51 and
  Something-Something v2 in :mod:`._official`, a file of ``path label`` lines
  (and a Python list of pairs as a root) in :mod:`._pathlabel`;
* :mod:`._paths`: paths whose names are any bytes: a root given as ``bytes``
  (:func:`decoded_path`), and such a path in text a person reads
  (:func:`printable_path`);
* :mod:`._layouts`: the records (:class:`VideoRecord`, :class:`Skipped`,
  :class:`DatasetIndex`) and the reader of each layout; what counts as a video
  file; :func:`unindexed`, what a split folder holds that the index does not;
* :mod:`._videoindex`: :class:`VideoIndex`, a split's probed videos as numpy
  columns (what a loader keeps per video: about 130 bytes), its rows
  (:class:`VideoRow`) and its fingerprint;
* :mod:`._shard`: :class:`Shard`, a deterministic share of the files for a
  scan or transcode spread over machines.

The dataset root is the folder these read (``KineticsDALILoader(root, ...)``);
nothing here writes under it. Imports neither torch nor a decoder.
"""

from daliload.dataset._index import (CSV_REQUIRED, SPLITS, VIDEO_EXTENSIONS, DatasetIndex, Layout, Skipped,
                                     VideoRecord, layout_of, load_classes, load_index, save_classes)
from daliload.dataset._pathlabel import write_pairs
from daliload.dataset._shards import is_label_member
from daliload.dataset._registry import (LAYOUTS, DatasetLayout, check_split, get_layout, register_layout,
                                        rewrite_video_names, side_files)
from daliload.dataset._paths import decoded_path, printable_path
from daliload.dataset._layouts import unindexed
from daliload.dataset._shard import ALL_FILES, Shard, parse_shard
from daliload.dataset._videoindex import ROUTE_CODES, ROUTE_NAMES, IndexBuilder, StringColumn, VideoIndex, VideoRow

__all__ = [
    "ALL_FILES", "CSV_REQUIRED", "LAYOUTS", "ROUTE_CODES", "ROUTE_NAMES", "SPLITS", "VIDEO_EXTENSIONS",
    "DatasetIndex", "DatasetLayout", "IndexBuilder", "Layout", "Shard", "Skipped", "StringColumn", "VideoIndex",
    "VideoRecord", "VideoRow", "check_split", "decoded_path", "get_layout", "is_label_member", "layout_of",
    "load_classes", "load_index", "parse_shard", "printable_path", "register_layout", "rewrite_video_names",
    "save_classes", "side_files", "unindexed", "write_pairs",
]
