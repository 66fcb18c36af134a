"""Write the reference part of docs/api.md from the code, so that it cannot drift from it.

Run ``python docs/gen_api.py`` after changing an option, a default or a
docstring (``--check`` only says whether docs/api.md is up to date, exit 1 if
not; ``tests/test_docs_api.py`` runs that comparison). Everything between the
markers comes from the public names of ``daliload``:

* defaults: ``inspect.signature`` (the loader's arguments) and
  ``dataclasses.fields`` (the specs), each shown as its ``repr``;
* what each one does: the Google-style ``Args:`` / ``Attributes:`` section of
  the docstring that owns it. An entry may name several fields
  (``mean, std: ...``), and its continuation lines are indented deeper::

      Attributes:
          size: output ``(height, width)`` in pixels ...
              ... continued here.
          mean, std: per-channel RGB normalisation ...

* the loader's methods and properties: their docstring's first paragraph;
  its plain attributes (``sampler``, ``classes``): the ``Attributes:`` section
  of the class docstring.

An argument, field or member with no entry, or an entry for a name that does
not exist, stops the generator with :class:`UndocumentedError` naming it, so
a new option cannot ship without its documentation.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Callable, Iterable, Sequence

import daliload
from daliload import AugmentSpec, BatchInfo, DecodeSpec, KineticsDALILoader, LoaderStats, OutputSpec, ScanSpec

API_MD = Path(__file__).resolve().with_name("api.md")
BEGIN = "<!-- api:begin: written by `python docs/gen_api.py` from the docstrings and defaults; do not edit by hand -->"
END = "<!-- api:end -->"

#: The loader's members a user touches, in the order the page lists them (``len`` is ``__len__``).
LOADER_MEMBERS = ("set_epoch", "sampler", "state_dict", "load_state_dict", "plan", "stats", "close", "videos",
                  "classes", "epoch", "__len__")

#: Sections of the page with a heading of their own: a docstring's reference to one links to it.
SECTIONS = ("KineticsDALILoader", "DecodeSpec", "ScanSpec", "AugmentSpec", "OutputSpec", "LoaderStats", "BatchInfo")

_ENTRY = re.compile(r"(?P<names>\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?:\([^)]*\))?:(?:\s+(?P<text>.*))?$")
_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")
_CODE = re.compile(r"(`+)(.+?)\1")


class UndocumentedError(ValueError):
    """A name that the reference must describe has no docstring entry (or an entry names nothing real)."""


# -- reading docstrings ------------------------------------------------------------------------------


def docstring_section(owner: object, section: str) -> dict[str, str]:
    """The entries of ``section`` (``"Args"``, ``"Attributes"``) of ``owner``'s docstring: ``{name: text}``.

    Each entry's lines are joined into one; ``a, b: text`` gives both names the
    text. An empty dict when the docstring has no such section.

    Raises:
        UndocumentedError: a line at the entries' indent that is not ``name: text``.
    """
    lines = inspect.cleandoc(owner.__doc__ or "").splitlines()
    header = next((i for i, line in enumerate(lines) if line.strip() == f"{section}:"), None)
    if header is None:
        return {}
    header_indent = _indent(lines[header])
    body: list[str] = []
    for line in lines[header + 1:]:
        if line.strip() and _indent(line) <= header_indent:
            break  # the next section, or the prose after this one
        body.append(line)
    entry_indent = min((_indent(line) for line in body if line.strip()), default=0)
    entries: dict[str, list[str]] = {}
    names: list[str] = []
    for line in body:
        if not line.strip():
            continue
        if _indent(line) == entry_indent:
            match = _ENTRY.match(line.strip())
            if match is None:
                raise UndocumentedError(f"{_name(owner)}: {section}: cannot read {line.strip()!r} as 'name: text'")
            names = [name.strip().lstrip("*") for name in match["names"].split(",")]
            for name in names:
                entries[name] = [match["text"] or ""]
        else:
            for name in names:
                entries[name].append(line.strip())
    return {name: " ".join(part for part in text if part) for name, text in entries.items()}


def first_paragraph(obj: object, what: str) -> str:
    """The first paragraph of ``obj``'s docstring, as one line; ``what`` names it in the error.

    Raises:
        UndocumentedError: ``obj`` has no docstring.
    """
    doc = inspect.getdoc(obj)
    if not doc:
        raise UndocumentedError(f"{what} has no docstring")
    return " ".join(line.strip() for line in doc.split("\n\n", 1)[0].splitlines())


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _name(owner: object) -> str:
    return getattr(owner, "__qualname__", repr(owner))


# -- rows ----------------------------------------------------------------------------------------------


def field_rows(cls: type, *, defaults: bool = True) -> list[tuple[str, ...]]:
    """One row per field of dataclass (or NamedTuple) ``cls``, in field order: ``(name, default, text)``,
    or ``(name, text)`` with ``defaults=False``; the text from its docstring's ``Attributes:`` section.

    Raises:
        UndocumentedError: a field with no entry, or an entry for a name that is no field.
    """
    doc = docstring_section(cls, "Attributes")
    if dataclasses.is_dataclass(cls):
        fields = [(f.name, _field_default(f)) for f in dataclasses.fields(cls)]
    else:  # a NamedTuple
        fields = [(name, _repr_default(cls._field_defaults.get(name, inspect.Parameter.empty)))
                  for name in cls._fields]
    _check_documented(cls, "field", [name for name, _ in fields], doc, "Attributes")
    return [(name, default, doc[name]) if defaults else (name, doc[name]) for name, default in fields]


def argument_rows(func: Callable, owner: object) -> list[tuple[str, str, str]]:
    """One row per argument of ``func`` (``self`` and ``**kwargs`` left out): ``(name, default, text)``,
    the text from ``owner``'s docstring's ``Args:`` section.

    Raises:
        UndocumentedError: an argument with no entry, or an entry for a name that is no argument.
    """
    doc = docstring_section(owner, "Args")
    params = _parameters(func)
    _check_documented(owner, "argument", [p.name for p in params], doc, "Args")
    return [(p.name, _repr_default(p.default), doc[p.name]) for p in params]


def member_rows(cls: type, names: Sequence[str]) -> list[tuple[str, str]]:
    """``(how a user writes it, text)`` for each of ``names``: a method's or property's first docstring
    paragraph, a plain attribute's entry in the class docstring's ``Attributes:`` section.

    Raises:
        UndocumentedError: a member with no docstring (or no entry), or a name ``cls`` does not have.
    """
    attributes = docstring_section(cls, "Attributes")
    rows = []
    for name in names:
        try:
            member = inspect.getattr_static(cls, name)
        except AttributeError:
            member = None
        what = f"{cls.__qualname__}.{name}"
        if isinstance(member, property):
            rows.append((f"loader.{name}", first_paragraph(member, what)))
        elif inspect.isfunction(member):
            shown = "len(loader)" if name == "__len__" else f"loader.{name}({_signature(member)})"
            rows.append((shown, first_paragraph(member, what)))
        elif name in attributes:  # set in __init__: documented in the class docstring
            rows.append((f"loader.{name}", attributes[name]))
        else:
            raise UndocumentedError(f"{what} has no docstring and no entry in the Attributes: section of the "
                                    f"{cls.__qualname__} docstring")
    return rows


def _check_documented(owner: object, kind: str, names: Sequence[str], doc: dict[str, str], section: str) -> None:
    missing = [name for name in names if name not in doc]
    if missing:
        raise UndocumentedError(
            f"{_name(owner)}: {kind}(s) {', '.join(f'{_name(owner)}.{n}' for n in missing)} not documented: add an "
            f"entry for each to the {section}: section of the {_name(owner)} docstring")
    stale = [name for name in doc if name not in names]
    if stale:
        raise UndocumentedError(f"{_name(owner)}: the {section}: section documents {', '.join(stale)}, which is "
                                f"not a {kind} of {_name(owner)}")


def _parameters(func: Callable) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(func).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _signature(func: Callable) -> str:
    """``func``'s arguments as a call shows them: defaults as ``repr``, no annotations, ``*`` kept."""
    parts: list[str] = []
    for p in _parameters(func):
        if p.kind is p.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return ", ".join(parts)


def _field_default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        return _repr_default(field.default_factory())
    return _repr_default(inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default)


def _repr_default(value: object) -> str:
    return "required" if value is inspect.Parameter.empty else f"`{value!r}`"


# -- markdown ------------------------------------------------------------------------------------------


def markdown(text: str) -> str:
    """Docstring markup as Markdown for a table cell.

    ````x```` becomes ```x```; a Sphinx role (``:class:`~daliload.plan.OutputSpec```)
    becomes the public name (``daliload.OutputSpec``; the last part for a name
    that is not public), linked to its section when this page has one; a ``|``
    or ``<`` outside code is escaped.

    Raises:
        ValueError: a ``|`` inside code (a table cell cannot hold it).
    """
    text = _ROLE.sub(lambda m: "``" + _public(m["target"], short=bool(m["tilde"])) + "``", text)
    out, last = [], 0
    for match in _CODE.finditer(text):
        out.append(_escape(text[last:match.start()]))
        code = match[2].strip() if match[2].strip() else match[2]
        if "|" in code:
            raise ValueError(f"a table cell cannot hold '|' inside code: {code!r}")
        anchor = code.removeprefix("daliload.")
        out.append(f"[`{code}`](#{anchor.lower()})" if anchor in SECTIONS else f"`{code}`")
        last = match.end()
    out.append(_escape(text[last:]))
    return "".join(out)


def _public(target: str, *, short: bool) -> str:
    """A role's target as a reader should see it: ``~a.b.Name`` as ``Name``; ``daliload.x.Name`` as
    ``daliload.Name`` when that is a public name, else as ``Name`` (module paths are no public API)."""
    name = target.rsplit(".", 1)[-1]
    if short:
        return name
    if target.startswith("daliload."):
        return f"daliload.{name}" if name in daliload.__all__ else name
    return target


def _escape(text: str) -> str:
    return text.replace("|", "&#124;").replace("<", "&lt;")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        name, *rest = row
        cells = [name if name.startswith("`") else f"`{name}`", *rest[:-1], markdown(rest[-1])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# -- the page --------------------------------------------------------------------------------------------


def render() -> str:
    """The text between the markers (without them), ending in a newline."""
    out: list[str] = []

    def section(title: str, lead: Sequence[str]) -> None:
        out.extend(["", f"## {title}", "", *lead])

    loader = KineticsDALILoader
    section("KineticsDALILoader", [
        markdown(first_paragraph(loader, "KineticsDALILoader")), "",
        "```python", f"KineticsDALILoader({_signature(loader.__init__)})", "```", "",
        "Arguments before `*` may be given by position. Any other keyword is refused with a `TypeError` that "
        "names what to use instead (a torch `DataLoader` keyword such as `num_workers`, or the closest "
        "option for a typo).", ""])
    out += table(("argument", "default", "what it does"), argument_rows(loader.__init__, loader))
    out += ["", "### Methods and attributes", ""]
    out += table(("member", "what it does"), member_rows(loader, LOADER_MEMBERS))

    for cls in (DecodeSpec, ScanSpec, AugmentSpec, OutputSpec):
        section(cls.__name__, [markdown(first_paragraph(cls, cls.__name__)), "",
                               f"`daliload.{cls.__name__}`, a frozen dataclass; every field is keyword.", ""])
        out += table(("field", "default", "what it does"), field_rows(cls))

    section("LoaderStats", [
        markdown(first_paragraph(LoaderStats, "LoaderStats")), "",
        "What `loader.stats()` returns. The counters are per epoch: those of the pass under way, or of the last "
        "pass between passes; each pass starts them again at zero. `rejected` (the pre-screen's verdicts), "
        "`rerouted`, `quarantined` and `dali_disabled` hold for the run so far, as their entries say.", ""])
    out += table(("field", "what it counts"), field_rows(LoaderStats, defaults=False))
    out += ["", *[f"- `{shown}`: {markdown(text)}" for shown, text in _extras(LoaderStats, ("dali_share", "format"))]]

    section("BatchInfo", [
        markdown(first_paragraph(BatchInfo, "BatchInfo")), "",
        "The third item of each batch with `with_info=True`: `for videos, labels, info in loader`.", ""])
    out += table(("field", "what it is"), field_rows(BatchInfo, defaults=False))
    return "\n".join(out) + "\n"


def _extras(cls: type, names: Sequence[str]) -> list[tuple[str, str]]:
    rows = []
    for name in names:
        member = inspect.getattr_static(cls, name)
        shown = f"{cls.__name__}.{name}" + ("" if isinstance(member, property) else "()")
        rows.append((shown, first_paragraph(member, f"{cls.__qualname__}.{name}")))
    return rows


def updated(page: str) -> str:
    """``page`` with the text between its markers replaced by :func:`render`'s.

    Raises:
        ValueError: the page lacks a marker.
    """
    start, end = page.find("<!-- api:begin"), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{API_MD} needs the markers '<!-- api:begin ... -->' and '{END}'")
    return page[:start] + BEGIN + "\n" + render() + "\n" + page[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether docs/api.md is up to date")
    args = parser.parse_args(argv)
    page = API_MD.read_text(encoding="utf-8")
    new = updated(page)
    if args.check:
        if new != page:
            print(f"{API_MD} is out of date: run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    if new != page:
        API_MD.write_text(new, encoding="utf-8")
        print(f"wrote {API_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
