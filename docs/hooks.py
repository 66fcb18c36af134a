"""MkDocs hook: the site's home page is README.md, so the two cannot drift apart.

``docs/index.md`` is a stub; when the site is built, :func:`on_page_markdown`
puts README.md in its place with the links rewritten for a page inside
``docs/`` (:func:`home_markdown`): ``docs/using.md#x`` becomes ``using.md#x``,
and a link to a file outside ``docs/`` (``benchmarks/RESULTS.md``), which the
site does not carry, keeps its text without the link. Listed in mkdocs.yml
under ``hooks``.
"""

from __future__ import annotations

import re
from pathlib import Path

#: A Markdown inline link: ``[text](target)``, the target without spaces or parentheses.
_LINK = re.compile(r"\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")


def home_markdown(readme: str) -> str:
    """README.md's text as a page of the docs site."""

    def rewrite(match: re.Match) -> str:
        text, target = match["text"], match["target"]
        if target.startswith(("http://", "https://", "mailto:", "#")):
            return match[0]
        if target.startswith("docs/"):
            return f"[{text}]({target[len('docs/'):]})"
        return text  # a file of the repository the site does not carry

    return _LINK.sub(rewrite, readme)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """The home page's Markdown: README.md's (rewritten); every other page's as it is."""
    if page.file.src_uri != "index.md":
        return markdown
    readme = Path(config["config_file_path"]).resolve().parent / "README.md"
    return home_markdown(readme.read_text(encoding="utf-8"))
