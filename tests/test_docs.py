"""The reference in docs/ builds strictly, every page is in the nav, and the README stays an entry page.

The strict build (`./dev docs` runs the same command) fails on a broken link or anchor between
pages and on a page the nav leaves out (mkdocs.yml's `validation`), so this one test keeps every
cross-reference of the docs alive.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 250


def nav_pages(entries: object) -> list[str]:
    """Every page file named in mkdocs.yml's nav, however deeply nested."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    return []


def test_the_docs_build_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").exists()


def test_the_readme_is_an_entry_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [target for target in targets if not re.match(r"[a-z]+://", target)]
    assert local, "the README links to no docs page"
    for target in local:
        path = target.split("#", 1)[0]
        assert path.startswith("docs/") and path.endswith(".md"), f"the README links to {target}, not a docs page"
        assert (ROOT / path).is_file(), f"the README links to {target}, which does not exist"


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = nav_pages(config["nav"])
    pages = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav))


def test_the_layout_page_lists_exactly_the_tree():
    """docs/layout.md names every folder and module of the package, and nothing that is not there."""
    import re

    package = ROOT / "gateway"
    tree = {f"gateway/{path.relative_to(package).as_posix()}" for path in package.rglob("*.py") if "__pycache__" not in path.parts}
    tree |= {f"gateway/{path.relative_to(package).as_posix()}/" for path in package.rglob("*") if path.is_dir() and (path / "__init__.py").exists()}
    tree.add("gateway/")
    page = (ROOT / "docs" / "layout.md").read_text()
    listed = set(re.findall(r"^\s*- `(gateway/[^`]*)`", page, re.M))
    assert sorted(tree - listed) == [], "modules missing from docs/layout.md"
    assert sorted(listed - tree) == [], "docs/layout.md names what is not in the tree"
