"""What the docs say, pulled out of the Markdown: fenced code blocks with their language and where they start, the
commands of shell and console blocks (with the output a console block shows), the prose outside code blocks, the
relative links and path-like words, the headings' GitHub anchors and the metric names they mention. The Markdown
itself is parsed by markdown-it-py (CommonMark); what is ours is what the docs' words mean: commands and their
output, paths, metric names.

Every test in tests/docs reads README.md and docs/*.md through here, so a doc that drifts fails a test naming
the file and the line.
"""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def rel(path: Path, root: Path = ROOT) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# CommonMark, as markdown-it-py parses it (GitHub's Markdown is CommonMark plus tables and autolinks, which change
# no fence, link, code span or heading the tests read).
_MD = MarkdownIt("commonmark")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language (the info string's first word, "" for none) and its text."""

    path: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


def _tokens(text: str) -> list[Token]:
    """The document's block tokens; ValueError on a fence never closed (CommonMark runs it to the end)."""
    tokens = _MD.parse(text)
    lines = text.splitlines()
    for t in tokens:
        if t.type == "fence" and t.map is not None:
            last = lines[t.map[1] - 1] if t.map[1] - 1 > t.map[0] else ""
            m = FENCE.match(last)
            if not (m and m["fence"][0] == t.markup[0] and not m["info"].strip()):
                raise ValueError(f"line {t.map[0] + 1}: a code fence is never closed")
    return tokens


def _code_lines(tokens: list[Token]) -> set[int]:
    """0-based lines of fenced and indented code blocks."""
    return {n for t in tokens if t.type in ("fence", "code_block") and t.map for n in range(*t.map)}


def blocks(path: Path) -> list[Block]:
    out = []
    for t in _tokens(path.read_text()):
        if t.type == "fence" and t.map is not None:
            info = t.info.strip()
            out.append(Block(path, t.map[0] + 1, info.split()[0] if info else "", t.content or "\n"))
    return out


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line outside code blocks."""
    text = path.read_text()
    code = _code_lines(_tokens(text))
    return [(i + 1, line) for i, line in enumerate(text.splitlines()) if line and i not in code]


def _inline(path: Path) -> Iterator[tuple[int, Token]]:
    """(1-based line, token) of every inline token of the document's prose: text, code spans, links, images."""
    for block in _tokens(path.read_text()):
        if block.type != "inline" or block.map is None or block.children is None:
            continue
        line = block.map[0] + 1
        for child in block.children:
            if child.type in ("softbreak", "hardbreak"):
                line += 1
            yield line, child


# ---------------------------------------------------------------------------------------------------------------
# Commands


SHELL_LANGS = {"sh", "bash", "shell"}
CONSOLE_LANGS = {"console"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    """One command line of a shell or console block (continuation lines joined, comments dropped)."""

    block: Block
    line: int
    """1-based line of the file where the command starts."""
    text: str
    """The command as a shell reads it, continuation backslashes removed, trailing comment included."""
    index: int
    """Its position among the block's commands."""
    output: tuple[str, ...] = ()
    """What the doc shows it printing: a console block's lines up to the next `$ `; in a shell block, the comment
    lines starting `#   ` (hash, three spaces) right after it."""
    words: tuple[str, ...] = field(default=())
    """shlex words, comments dropped."""

    @property
    def where(self) -> str:
        return f"{rel(self.block.path)}:{self.line}"

    @property
    def env(self) -> dict[str, str]:
        """Leading `NAME=value` assignments."""
        out: dict[str, str] = {}
        for w in self.words:
            if not ENV_ASSIGNMENT.match(w):
                break
            name, _, value = w.partition("=")
            out[name] = value
        return out

    @property
    def argv(self) -> list[str]:
        """The words after the leading environment assignments."""
        return list(self.words[len(self.env) :])

    @property
    def program(self) -> str:
        return Path(self.argv[0]).name if self.argv else ""


def _logical_lines(lines: list[str], first_line: int) -> list[tuple[int, str, list[str]]]:
    """(line number, joined line, raw lines) with backslash continuations joined."""
    out: list[tuple[int, str, list[str]]] = []
    pending: tuple[int, str, list[str]] | None = None
    for n, raw in enumerate(lines, start=first_line):
        stripped = raw.rstrip()
        cont = stripped.endswith("\\")
        piece = stripped[:-1] if cont else stripped
        if pending is None:
            pending = (n, piece, [raw])
        else:
            pending = (pending[0], pending[1] + " " + piece.strip(), [*pending[2], raw])
        if not cont:
            out.append(pending)
            pending = None
    if pending is not None:
        out.append(pending)
    return out


def commands(block: Block) -> list[Command]:
    """The commands of a shell (sh, bash) or console block; [] for any other language."""
    body = block.text.splitlines()
    first = block.line + 1
    found: list[Command] = []
    if block.lang in SHELL_LANGS:
        outputs: list[str] = []
        for n, text, raw in _logical_lines(body, first):
            if raw[0].startswith("#   ") and found:
                outputs.append(raw[0][4:])
                found[-1] = _with_output(found[-1], outputs)
                continue
            if not text.strip() or text.lstrip().startswith("#"):
                outputs = []
                continue
            outputs = []
            found.append(_command(block, n, text.strip(), len(found)))
        return found
    if block.lang in CONSOLE_LANGS:
        pending: list[tuple[int, str, list[str]]] = []
        i = 0
        while i < len(body):
            line = body[i]
            if line.startswith("$ "):
                group = [line[2:]]
                while group[-1].rstrip().endswith("\\") and i + 1 < len(body):
                    i += 1
                    group.append(body[i])
                (n, text, _), *_ = _logical_lines(group, first + i - len(group) + 1)
                pending.append((n, text.strip(), []))
            elif pending:
                pending[-1][2].append(line)
            i += 1
        for n, text, shown in pending:
            while shown and not shown[-1].strip():
                shown.pop()
            found.append(_with_output(_command(block, n, text, len(found)), shown))
        return found
    return []


def _command(block: Block, line: int, text: str, index: int) -> Command:
    return Command(block, line, text, index, (), tuple(shlex.split(text, comments=True)))


def _with_output(cmd: Command, output: list[str]) -> Command:
    return Command(cmd.block, cmd.line, cmd.text, cmd.index, tuple(output), cmd.words)


def optional_variants(words: list[str]) -> list[list[str]]:
    """A doc's `[--flag]` (optional) words: the command without them, then with them (brackets removed)."""
    optional = [i for i, w in enumerate(words) if re.fullmatch(r"\[[^\[\]]+\]", w)]
    if not optional:
        return [words]
    without = [w for i, w in enumerate(words) if i not in optional]
    with_all = [w[1:-1] if i in optional else w for i, w in enumerate(words)]
    return [without, with_all]


def normalize(text: str) -> str:
    return " ".join(text.split())


def shown_matches(shown: list[str] | tuple[str, ...], actual: str) -> str | None:
    """None when `actual` prints what the doc shows; else what differs. Whitespace (and so line wrapping) is not
    compared; `...` in the doc elides: the pieces between must appear in `actual` in that order."""
    got = normalize(actual)
    pieces = [normalize(p) for p in re.split(r"\.\.\.", "\n".join(shown))]
    if len(pieces) == 1:
        return None if pieces[0] == got else f"the doc shows\n  {pieces[0]}\nit printed\n  {got}"
    pos = 0
    for piece in pieces:
        if not piece:
            continue
        at = got.find(piece, pos)
        if at < 0:
            return f"the doc shows\n  {piece}\nwhich is not in what it printed (after position {pos})\n  {got}"
        pos = at + len(piece)
    return None


# ---------------------------------------------------------------------------------------------------------------
# Links, paths and anchors


URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
FILE_EXT = re.compile(r"\.(md|py|ya?ml|json|sh|txt|toml|tpl|cfg|ini|png|svg|jpe?g|csv)$")


@dataclass(frozen=True)
class Ref:
    """A link target or a path-like word of a doc, and where."""

    path: Path
    line: int
    target: str
    how: str
    """`link`, `code` (inside a backticked span) or `prose`."""

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


def links(path: Path) -> list[Ref]:
    """Every Markdown link and image of the prose (not in code blocks or code spans)."""
    out = []
    for line, t in _inline(path):
        if t.type == "link_open":
            out.append(Ref(path, line, str(t.attrGet("href")), "link"))
        elif t.type == "image":
            out.append(Ref(path, line, str(t.attrGet("src")), "link"))
    return out


def top_level_entries(root: Path = ROOT) -> set[str]:
    """What a repository path can start with: the root's files and folders (hidden ones and outputs aside)."""
    ignored = ignored_dirs(root)
    return {p.name for p in root.iterdir() if not p.name.startswith(".") and p.name + "/" not in ignored}


def ignored_dirs(root: Path = ROOT) -> set[str]:
    """Folders .gitignore names (`/bench/results/`, `.venv/`), as `path/` relative to the root."""
    out = set()
    for line in (root / ".gitignore").read_text().splitlines():
        line = line.strip()
        if line.endswith("/") and not any(c in line for c in "*?[!#"):
            out.add(line.lstrip("/"))
    return out


def looks_like_path(word: str, top: set[str]) -> bool:
    """A repository path: relative, starting with one of the root's entries (`runtime/`, `examples/x.yaml`,
    `Dockerfile.runtime`), or with a folder and a file extension (`notes/x.md`). Not: URLs, absolute paths,
    placeholders (`<rank>`, `$VAR`), `a/b` fractions and API groups (`zerotrain.dev/job`)."""
    if not word or word[0] in "/~-$" or any(c in word for c in "<>$=:{}()'\"@|,") or URL.search(word):
        return False
    if not re.fullmatch(r"[\w.*-]+(/[\w.*-]+)*/?", word):
        return False
    first = word.split("/")[0]
    if "/" not in word:
        return first in top and "." in first  # a root file named bare: `constraints.txt`, `Dockerfile.operator`
    if first in top:
        return True
    return bool(FILE_EXT.search(word)) and "." not in first  # `k8s.io/x.yaml` is a domain, not a folder


def path_words(path: Path, top: set[str] | None = None) -> list[Ref]:
    """Path-like words of code spans, and of the prose's text (link texts included, their targets, URLs and code
    not)."""
    top = top_level_entries() if top is None else top
    out = []
    for n, t in _inline(path):
        if t.type == "code_inline":
            for w in t.content.split():
                w = w.rstrip(".,;:")
                if looks_like_path(w, top):
                    out.append(Ref(path, n, w, "code"))
        elif t.type == "text":
            for w in re.findall(r"[\w./*-]+", URL.sub(" ", t.content)):
                w = w.rstrip(".,;:*")
                if "/" in w and looks_like_path(w, top):
                    out.append(Ref(path, n, w, "prose"))
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup (links' texts, code spans' contents, no
    emphasis markers or HTML), lowercased, punctuation other than `-` and `_` removed, spaces turned into `-`
    (github-slugger)."""
    (inline,) = _MD.parseInline(heading)
    text = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 ... for repeats."""
    seen: dict[str, int] = {}
    out = set()
    tokens = _tokens(path.read_text())
    for heading, inline in itertools.pairwise(tokens):
        if heading.type != "heading_open":
            continue
        slug = github_slug(inline.content)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


# ---------------------------------------------------------------------------------------------------------------
# Metric names


METRIC = re.compile(r"(?<![\w./$-])zerotrain_(?:[a-z0-9_*]|\{[a-z0-9_,]+\})+")
ABBREVIATION = re.compile(r"^\s*(?:,|/|and|or)\s*`(_[a-z0-9_]+)`")


@dataclass(frozen=True)
class MetricMention:
    """A `zerotrain_...` name a doc mentions. `candidates` are the names it can stand for: one, or several for a
    name abbreviated after a full one (`zerotrain_checkpoint_saves_total`, `_save_seconds_total`: the tail replaces
    some tail of the full name). `prefix` is set for a wildcard (`zerotrain_comm_*`)."""

    path: Path
    line: int
    text: str
    candidates: tuple[str, ...]
    prefix: bool = False

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


def expand_braces(name: str) -> list[str]:
    """`zerotrain_comm_{calls,bytes}_total` -> both names; a trailing `{label}` (a selector) is dropped."""
    name = re.sub(r"\{[a-z_]+\}$", "", name)
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m[1].split(",") for x in expand_braces(name[: m.start()] + alt + name[m.end() :])]


def metric_mentions(path: Path) -> list[MetricMention]:
    """Every `zerotrain_[a-z_]+` name in the file (prose and code blocks), braces expanded, with its abbreviations.
    `zerotrain_` followed by anything but a lowercase name (ZEROTRAIN_ env vars, `zerotrain.runtime`) is not one."""
    out: list[MetricMention] = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        for m in METRIC.finditer(line):
            text = m[0]
            for name in expand_braces(text):
                if name.endswith("*"):
                    out.append(MetricMention(path, n, text, (name.rstrip("*"),), prefix=True))
                    continue
                out.append(MetricMention(path, n, text, (name,)))
                # `zerotrain_a_b_c`, `_d_e` ...: each abbreviation after it.
                tail = line[m.end() :].lstrip("`")
                while a := ABBREVIATION.match(tail):
                    parts = name.split("_")
                    cands = tuple("_".join(parts[:k]) + a[1] for k in range(2, len(parts)))
                    out.append(MetricMention(path, n, a[1], cands))
                    tail = tail[a.end() :].lstrip("`")
    return out
