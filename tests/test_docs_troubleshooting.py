"""docs/troubleshooting.md quotes the messages the package really writes.

Every code span on a quoted line of the page (``> `...` ``, or a line that
starts ``message:``) must occur in one string literal of the package's source
(``daliload/`` and ``fallback/``; docstrings do not count), where ``…`` in the
quote stands for whatever the code fills in: an f-string's ``{...}``, a
``%s``-style placeholder, or text the page leaves out. A message reworded in
the code fails here until the page follows.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "troubleshooting.md"
PACKAGES = ("daliload", "fallback")
HOLE = "\x00"  # an f-string's {...} in a literal's text
_PRINTF = re.compile(r"%(?:\.\d+)?[sdrgf]")
_QUOTED_LINE = re.compile(r"^\s*(?:>\s|(?:[-*]\s+)?(?:\*\*)?message(?::\*\*|\*\*:|:))", re.IGNORECASE)
_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")


def quoted_messages(text: str) -> list[str]:
    """The code spans of the page's quoted lines, in order, stripped."""
    messages = []
    for line in text.splitlines():
        if _QUOTED_LINE.match(line):
            messages += [span.strip() for _, span in _CODE_SPAN.findall(line)]
    return messages


@lru_cache(maxsize=None)
def source_literals() -> tuple[str, ...]:
    """The text of every string literal in the package, an f-string's fields as :data:`HOLE` (docstrings and
    other bare string statements left out: a message has to be in code)."""
    texts = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
            for node in ast.walk(tree):
                if id(node) in bare:
                    continue
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    texts.append(_PRINTF.sub(HOLE, node.value))
                elif isinstance(node, ast.JoinedStr):
                    texts.append("".join(part.value if isinstance(part, ast.Constant) else HOLE
                                         for part in node.values))
    return tuple(texts)


def in_source(message: str) -> bool:
    """Whether one literal of the package reads ``message``, each ``…`` matching anything (a hole included)."""
    pattern = re.compile(".*?".join(re.escape(piece) for piece in message.split("…")), re.DOTALL)
    return any(pattern.search(text) for text in source_literals())


def test_the_page_quotes_messages():
    messages = quoted_messages(PAGE.read_text(encoding="utf-8"))
    assert len(messages) >= 40, messages  # the parser found the quotes (a format change would find none)
    for needed in ("videos failed to decode, more than", "DALI did not finish a batch",
                   "was started inside a worker process", "NVIDIA DALI is not installed",
                   "is damaged", "waiting for the scan of", "while decoding this sample",
                   "is a torch DataLoader option", "cannot resume", "must be a multiple of clips_per_video",
                   "disagrees with the crop size"):
        assert any(needed in m for m in messages), f"the page quotes no message with {needed!r}"


@pytest.mark.parametrize("message", quoted_messages(PAGE.read_text(encoding="utf-8")), ids=lambda m: m[:48])
def test_quoted_message_is_in_the_source(message):
    assert in_source(message), (f"docs/troubleshooting.md quotes {message!r}, which no string literal of "
                                f"{' or '.join(PACKAGES)} reads: the message changed; quote the new text")


def test_the_check_catches_a_changed_message():
    assert in_source("cannot resume: the state was saved with …=…, this loader has …=… (the plan would differ)")
    assert not in_source("cannot resume: the state was saved with …=…, this loader has …=… (plans differ)")
    assert not in_source("A KineticsDALILoader was started inside a worker process")  # "A ..." is an argument
    assert not in_source("a daliload docstring is no message")  # bare strings do not count
    assert quoted_messages("> `a` and `b`\nMessage: ``x `y` z``\n- **message:** `c`\nplain `not quoted`\n") == \
        ["a", "b", "x `y` z", "c"]
