"""docs/api.md is what docs/gen_api.py writes from the code, and the generator refuses an undocumented name.

So a changed default or docstring shows up as a failing test until the page
is regenerated, and an option added without a docstring entry fails here
before it ships without documentation.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers.docs_modules import load_docs_module

ROOT = Path(__file__).resolve().parents[1]


gen = load_docs_module("gen_api.py")


def test_committed_page_is_what_the_generator_writes():
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    regenerated = gen.updated(page)
    diff = "".join(difflib.unified_diff(page.splitlines(True), regenerated.splitlines(True),
                                        "docs/api.md (committed)", "docs/api.md (regenerated)", n=1))
    assert regenerated == page, f"docs/api.md is out of date: run python docs/gen_api.py\n{diff[:4000]}"


def test_page_has_a_row_for_every_option():
    page = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    from daliload import AugmentSpec, BatchInfo, DecodeSpec, KineticsDALILoader, LoaderStats, OutputSpec, ScanSpec

    names = [p for p in inspect.signature(KineticsDALILoader.__init__).parameters if p not in ("self", "unknown")]
    for cls in (DecodeSpec, ScanSpec, AugmentSpec, OutputSpec, LoaderStats):
        names += [f.name for f in dataclasses.fields(cls)]
    names += list(BatchInfo._fields)
    missing = [name for name in names if f"| `{name}` |" not in page]
    assert not missing
    assert "| `default_factory` |" not in page
    assert "| `max_failure_fraction` | `0.05` |" in page  # the real default's repr


def test_an_undocumented_field_fails_naming_it():
    @dataclasses.dataclass(frozen=True)
    class FakeSpec:
        """A spec with a new option nobody documented.

        Attributes:
            clip_len: frames per clip.
        """

        clip_len: int = 16
        new_option: bool = False

    with pytest.raises(gen.UndocumentedError, match=r"FakeSpec\.new_option"):
        gen.field_rows(FakeSpec)


def test_an_undocumented_argument_fails_naming_it():
    class FakeLoader:
        """A loader.

        Args:
            source: where the videos are.
        """

        def __init__(self, source: str, *, turbo: bool = False, **unknown: object) -> None:
            pass

    with pytest.raises(gen.UndocumentedError, match=r"FakeLoader\.turbo"):
        gen.argument_rows(FakeLoader.__init__, FakeLoader)


def test_an_entry_for_a_name_that_is_gone_fails():
    @dataclasses.dataclass(frozen=True)
    class FakeSpec:
        """A spec whose docstring kept a removed option.

        Attributes:
            clip_len: frames per clip.
            removed: was an option once.
        """

        clip_len: int = 16

    with pytest.raises(gen.UndocumentedError, match="removed"):
        gen.field_rows(FakeSpec)


def test_a_member_without_a_docstring_fails_naming_it():
    class FakeLoader:
        """A loader.

        Attributes:
            classes: the class names.
        """

        def rewind(self) -> None:
            pass

        @property
        def epoch(self) -> int:
            """The epoch."""
            return 0

    assert gen.member_rows(FakeLoader, ("epoch", "classes")) == [("loader.epoch", "The epoch."),
                                                                  ("loader.classes", "the class names.")]
    with pytest.raises(gen.UndocumentedError, match=r"FakeLoader\.rewind"):
        gen.member_rows(FakeLoader, ("rewind",))
    with pytest.raises(gen.UndocumentedError, match=r"FakeLoader\.sampler"):
        gen.member_rows(FakeLoader, ("sampler",))


def test_entries_spanning_lines_and_names():
    class Info(NamedTuple):
        """Rows.

        Attributes:
            mean, std: per-channel
                normalisation, in ``0..255`` units.
            mode:
                ``"a"``: one thing.
                ``"b"``: another.

        Prose after the section is not an entry.
        """

        mean: float
        std: float
        mode: str

    assert gen.docstring_section(Info, "Attributes") == {
        "mean": "per-channel normalisation, in ``0..255`` units.",
        "std": "per-channel normalisation, in ``0..255`` units.",
        "mode": '``"a"``: one thing. ``"b"``: another.'}
    assert gen.field_rows(Info, defaults=False)[1] == ("std", "per-channel normalisation, in ``0..255`` units.")


def test_markup_becomes_markdown():
    assert gen.markdown("see :class:`~daliload.plan.OutputSpec` and :func:`daliload.plan.make_val_plan`") == \
        "see [`OutputSpec`](#outputspec) and `make_val_plan`"
    assert gen.markdown(":class:`daliload.plan.ClipSpec`, ``x < y``, a < b") == "`daliload.ClipSpec`, `x < y`, a &lt; b"
    with pytest.raises(ValueError, match="cannot hold"):
        gen.markdown("``a | b``")


def test_a_page_without_markers_is_refused():
    with pytest.raises(ValueError, match="markers"):
        gen.updated("# API\n")
