"""Every relative link and every repository path README.md and docs/*.md cite exists.

- Markdown links and images `[..](target)` outside code: the target, relative to the doc (GitHub's rule), exists;
  its `#anchor` is a heading of the target file (GitHub's slugs), or of the doc itself for `(#anchor)`.
- Path-like words of code spans and prose (`runtime/examples/gpt.py`, `charts/zerotrain-operator/`,
  `bench/compare/compare*.py`, `notes/x.md`): starting with one of the repository root's entries, or a folder and a
  file extension. They are relative to the repository root (or, failing that, to the doc). Globs match something.
- A path inside a folder .gitignore names (`bench/results/`) is no file of the repository: it must be listed in
  GENERATED with the script that writes it, and that script must name it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from md_extract import ROOT, Ref, anchors, doc_files, ignored_dirs, links, path_words

LINKS = [r for f in doc_files() for r in links(f)]
PATHS = [r for f in doc_files() for r in path_words(f)]

# A path the docs cite that a run writes, never committed -> the script that writes it.
GENERATED = {
    "bench/results/compare.json": "bench/compare/compare.py",
}


def where(r: Ref) -> str:
    return f"{r.where}:{r.target}"


def test_the_docs_link_and_cite_paths() -> None:
    assert len(LINKS) > 20 and len(PATHS) > 50
    assert set(GENERATED) <= {r.target for r in PATHS}, "GENERATED lists a path no doc cites any more"


RELATIVE = [r for r in LINKS if "://" not in r.target and not r.target.startswith("mailto:")]


@pytest.mark.parametrize("ref", RELATIVE, ids=where)
def test_relative_link_resolves(ref: Ref) -> None:
    target, _, anchor = ref.target.partition("#")
    path = (ref.path.parent / target).resolve() if target else ref.path
    assert path.exists(), f"{ref.where}: the link {ref.target} points at {path}, which does not exist"
    if anchor:
        assert path.suffix == ".md", f"{ref.where}: an anchor into {path.name}, not a Markdown file"
        assert anchor in anchors(path), (
            f"{ref.where}: {path.name} has no heading #{anchor}; its anchors: {sorted(anchors(path))}"
        )


def resolve(ref: Ref) -> list[Path]:
    word = ref.target.rstrip("/")
    for base in (ROOT, ref.path.parent):
        found = sorted(base.glob(word)) if any(c in word for c in "*?[") else [base / word]
        found = [p for p in found if p.exists()]
        if found:
            return found
    return []


@pytest.mark.parametrize("ref", PATHS, ids=where)
def test_cited_path_exists(ref: Ref) -> None:
    ignored = next((d for d in ignored_dirs() if ref.target.startswith(d)), None)
    if ignored:
        writer = GENERATED.get(ref.target)
        assert writer, (
            f"{ref.where}: {ref.target} is under {ignored}, which git ignores: not a file of the repository; "
            "cite the script that writes it, or list it in GENERATED"
        )
        assert Path(ref.target).name in (ROOT / writer).read_text(), f"{writer} does not write {ref.target}"
        return
    assert resolve(ref), f"{ref.where}: {ref.target} ({ref.how}) is not in the repository"
