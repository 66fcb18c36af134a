"""The docs site's home page is README.md (docs/hooks.py), its links rewritten for a page in docs/."""

from __future__ import annotations

import re
import types
from pathlib import Path

from helpers.docs_modules import load_docs_module

REPO = Path(__file__).resolve().parents[1]


def _hooks():
    return load_docs_module("hooks.py")


def _page(src_uri: str):
    return types.SimpleNamespace(file=types.SimpleNamespace(src_uri=src_uri))


def test_links_into_docs_lose_the_folder_and_links_out_of_it_keep_only_their_text():
    text = ("See [the API](docs/api.md#options), [`RESULTS`](benchmarks/RESULTS.md), [DALI](https://nvidia.com), "
            "[below](#speed) and `docs/using.md` in code.")
    assert _hooks().home_markdown(text) == (
        "See [the API](api.md#options), `RESULTS`, [DALI](https://nvidia.com), [below](#speed) and "
        "`docs/using.md` in code.")


def test_the_home_page_is_the_readme_and_every_link_it_keeps_names_a_page_of_the_site(tmp_path):
    hooks = _hooks()
    config = {"config_file_path": str(REPO / "mkdocs.yml")}
    home = hooks.on_page_markdown("stub", _page("index.md"), config, None)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert home == hooks.home_markdown(readme)
    assert home.splitlines()[0] == readme.splitlines()[0] and "## Speed" in home
    targets = re.findall(r"\]\(([^)\s]+)\)", home)
    local = [t for t in targets if not t.startswith(("http://", "https://", "#"))]
    assert local, "the README links no page of the docs"
    missing = [t for t in local if not (REPO / "docs" / t.split("#")[0]).is_file()]
    assert not missing, f"home-page links to no page of the site: {missing}"


def test_other_pages_are_left_as_they_are():
    assert _hooks().on_page_markdown("# Using", _page("using.md"), {"config_file_path": "x"}, None) == "# Using"


def test_the_site_runs_the_hook_and_does_not_publish_it():
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^hooks:\n  - docs/hooks\.py$", config, re.M)
    assert re.search(r"^exclude_docs: \|\n(  .*\n)*  hooks\.py$", config, re.M)
