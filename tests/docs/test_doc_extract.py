"""The extractor the docs tests read Markdown through: blocks, commands and their shown output, optional flags,
output comparison, links, path-like words, GitHub anchors and metric names, on small made-up docs."""

from __future__ import annotations

from pathlib import Path

import pytest
from md_extract import (
    anchors,
    blocks,
    commands,
    expand_braces,
    github_slug,
    links,
    looks_like_path,
    metric_mentions,
    optional_variants,
    path_words,
    prose_lines,
    shown_matches,
)

DOC = """# Title

Run `runtime/examples/gpt.py` or see [the guide](guide.md#side-by-side-a-b) and shared/notes/x.md, 1/2 of
`zerotrain.dev/job`, `/dev/shm`, `<rank>/x.py`.

```sh
make demo   # a comment
helm upgrade x charts/y -n ns \\
  --set a.b=true --set 'c={d,e}'
#   printed: 1
# just a comment
```

```console
$ zerotrain plan -f job.yaml \\
    --measure
line one
line two

$ zerotrain validate job.yaml
error: job.yaml is invalid:
```

```yaml
spec: {}
```

```
output
```

## Side by side: A, `B` — C_d

`zerotrain_a_b_total`, `_c_total` and `zerotrain_x_{p,q}_bytes`, `zerotrain_m{label}`, `zerotrain_w_*`,
ZEROTRAIN_ENV and zerotrain.runtime.
"""


@pytest.fixture
def doc(tmp_path: Path) -> Path:
    p = tmp_path / "doc.md"
    p.write_text(DOC)
    return p


def test_blocks_have_their_language_and_line(doc: Path) -> None:
    found = [(b.line, b.lang) for b in blocks(doc)]
    assert found == [(6, "sh"), (14, "console"), (24, "yaml"), (28, "")]
    assert blocks(doc)[2].text == "spec: {}\n"
    assert all("make demo" not in line for _, line in prose_lines(doc))


def test_shell_commands_join_continuations_drop_comments_and_keep_output_comments(doc: Path) -> None:
    sh = commands(blocks(doc)[0])
    assert [c.argv for c in sh] == [
        ["make", "demo"],
        ["helm", "upgrade", "x", "charts/y", "-n", "ns", "--set", "a.b=true", "--set", "c={d,e}"],
    ]
    assert [c.line for c in sh] == [7, 8]
    assert sh[1].output == ("printed: 1",) and sh[0].output == ()


def test_console_commands_carry_the_output_shown_after_them(doc: Path) -> None:
    con = commands(blocks(doc)[1])
    assert [c.argv for c in con] == [
        ["zerotrain", "plan", "-f", "job.yaml", "--measure"],
        ["zerotrain", "validate", "job.yaml"],
    ]
    assert con[0].output == ("line one", "line two") and con[0].line == 15
    assert con[1].output == ("error: job.yaml is invalid:",) and con[1].line == 20
    assert commands(blocks(doc)[2]) == []


def test_env_assignments_and_optional_flags() -> None:
    from md_extract import Block, Command

    c = Command(
        Block(Path("x.md"), 1, "sh", ""),
        2,
        "A=1 B=2 .venv/bin/pytest t -q",
        0,
        (),
        ("A=1", "B=2", ".venv/bin/pytest", "t"),
    )
    assert c.env == {"A": "1", "B": "2"} and c.argv == [".venv/bin/pytest", "t"] and c.program == "pytest"
    assert optional_variants(["x", "--a", "[--b]"]) == [["x", "--a"], ["x", "--a", "--b"]]
    assert optional_variants(["x"]) == [["x"]]


def test_shown_output_ignores_whitespace_and_elides_at_dots() -> None:
    assert shown_matches(["a  b", "c"], "a b\n  c\n") is None
    assert shown_matches(["a b c"], "a b d") is not None
    assert shown_matches(["one of: x, ..."], "x\none of: x, y, z") is None
    assert shown_matches(["first", "...", "last"], "first middle last") is None
    assert shown_matches(["first", "...", "last"], "last middle first") is not None


def test_links_paths_and_anchors(doc: Path) -> None:
    assert [r.target for r in links(doc)] == ["guide.md#side-by-side-a-b"]
    top = {"runtime", "charts", "README.md"}
    words = {r.target: r.how for r in path_words(doc, top)}
    assert words == {"runtime/examples/gpt.py": "code", "shared/notes/x.md": "prose"}
    assert looks_like_path("charts/zerotrain-operator/ci/*-values.yaml", top)
    assert looks_like_path("README.md", top) and not looks_like_path("job.yaml", top)
    assert not looks_like_path("nvidia.com/gpu", top) and not looks_like_path("k8s.io/x.yaml", top)
    assert github_slug("Side by side: A, `B` — C_d") == "side-by-side-a-b--c_d"
    assert github_slug("GPUs and [fast](x.md) interconnects") == "gpus-and-fast-interconnects"
    assert anchors(doc) == {"title", "side-by-side-a-b--c_d"}


def test_metric_names_expand_braces_abbreviations_and_wildcards(doc: Path) -> None:
    found = [(m.text, m.candidates, m.prefix) for m in metric_mentions(doc)]
    assert found == [
        ("zerotrain_a_b_total", ("zerotrain_a_b_total",), False),
        ("_c_total", ("zerotrain_a_c_total", "zerotrain_a_b_c_total"), False),
        ("zerotrain_x_{p,q}_bytes", ("zerotrain_x_p_bytes",), False),
        ("zerotrain_x_{p,q}_bytes", ("zerotrain_x_q_bytes",), False),
        ("zerotrain_m{label}", ("zerotrain_m",), False),
        ("zerotrain_w_*", ("zerotrain_w_",), True),
    ]
    assert expand_braces("zerotrain_c_{a,b}_x{op}") == ["zerotrain_c_a_x", "zerotrain_c_b_x"]
