"""Running what the docs show: the real `zerotrain` CLI in a scratch directory (runs deduplicated across docs),
Helm commands rendered through tests/chart/chart_util.py, and the kinds of YAML block the docs hold."""

from __future__ import annotations

import copy
import functools
import itertools
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from budget import budget
from md_extract import ROOT, Block

sys.path.insert(0, str(ROOT / "tests" / "chart"))

# tests/chart is not a package: its own tests import chart_util from their folder, as this does.
import chart_util

API_VERSION, KIND = "zerotrain.dev/v1alpha1", "ZeroTrainingJob"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
Obj = dict[str, Any]


def zerotrain_exe() -> str:
    """The `zerotrain` script of the environment running the tests."""
    beside = Path(sys.executable).with_name("zerotrain")
    found = str(beside) if beside.exists() else shutil.which("zerotrain")
    assert found, "the zerotrain command is not installed (pip install -e '.[dev]')"
    return found


@dataclass
class Ran:
    """One finished command."""

    argv: list[str]
    cwd: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr

    def tail(self, n: int = 40) -> str:
        lines = self.output.splitlines()
        return "\n".join(lines[-n:])


def cli(args: list[str], cwd: Path, timeout: float = 240) -> Ran:
    """`zerotrain ARGS` in `cwd`, its output not a terminal, 160 columns (the docs' tables are wider than 80)."""
    env = {**os.environ, "PYTHONSAFEPATH": "1", "COLUMNS": "160", "NO_COLOR": "1"}
    env.pop("ZEROTRAIN_DEBUG", None)
    argv = [zerotrain_exe(), *args]
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=budget(timeout), check=False)
    return Ran(["zerotrain", *args], cwd, p.returncode, p.stdout, p.stderr)


def cli_in_process(args: list[str], cwd: Path) -> Ran:
    """`zerotrain ARGS` run by this process's own `zerotrain.cli.main`, in `cwd`, as `cli` runs it: for commands
    that start no rank (validate), whose cost as a new process is mostly importing torch again."""
    import contextlib
    import io

    from zerotrain.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR", "ZEROTRAIN_DEBUG")}
    os.environ.update({"COLUMNS": "160", "NO_COLOR": "1"})
    os.environ.pop("ZEROTRAIN_DEBUG", None)
    here = Path.cwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as e:  # argparse's own refusals
                code = e.code if isinstance(e.code, int) else 2
    finally:
        os.chdir(here)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Ran(["zerotrain", *args], cwd, code, out.getvalue(), err.getvalue())


def free_port() -> int:
    """A port nobody listens on now, from the OS."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_help: dict[str, str] = {}


def metrics_port_zero_supported(scratch: Path) -> bool:
    """Whether `zerotrain run --metrics-port 0` means "any free ports" (its help says what 0 does)."""
    if "run" not in _help:
        _help["run"] = normalize_help(cli(["run", "--help"], scratch).stdout)
    m = re.search(r"--metrics-port METRICS_PORT (.*?)(?= --[a-z]|$)", _help["run"])
    return bool(m and re.search(r"(?<![\w.])0(?![\w.])", m[1]))


def normalize_help(text: str) -> str:
    return " ".join(text.split())


_dirs = itertools.count()


@functools.cache
def tracked_top_level() -> frozenset[str]:
    """The repository's top-level entries git tracks (every existing one where git cannot say)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return frozenset(p.name for p in ROOT.iterdir())
    return frozenset(f.split("/")[0] for f in listed.decode().split("\0") if f)


def scratch_dir(root: Path, name: str, uses: list[str]) -> Path:
    """A fresh working directory where the repository paths `uses` names (`examples/quickstart.yaml`) resolve:
    a link to each tracked top-level entry they start with. Never the user's own untracked files (a `runs/` the
    llama-tiny README wrote at the root): the commands would read or write through them."""
    d = root / f"{name}-{next(_dirs)}"
    d.mkdir(parents=True)
    for word in uses:
        first = word.split("/")[0]
        if first in tracked_top_level() and not (d / first).exists():
            (d / first).symlink_to(ROOT / first)
    return d


# ---------------------------------------------------------------------------------------------------------------
# YAML blocks


def quickstart() -> Obj:
    doc = yaml.safe_load(QUICKSTART.read_text())
    assert isinstance(doc, dict)
    return doc


def on_quickstart(over: Obj) -> Obj:
    """`over` laid onto the quickstart. Its `batch_size` is the global micro-batch, `model.shape.microBatchSize`
    rows per rank: a fragment that changes the ranks and says nothing of either keeps each rank's micro-batch, as a
    reader adapting the quickstart would (validate checks the shape against the rows the entry point draws)."""
    doc = merge(quickstart(), over)
    said = over.get("spec") or {}
    spec = doc["spec"]
    shape = (spec.get("model") or {}).get("shape")
    if shape and "model" not in said and "batch_size" not in (said.get("entrypointArgs") or {}):
        spec["entrypointArgs"]["batch_size"] = shape["microBatchSize"] * ranks(doc)
    return doc


def merge(base: Any, over: Any) -> Any:
    """`over` laid onto `base`: mappings merged key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(base.get(k), v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def chart_value_keys() -> set[str]:
    values = yaml.safe_load((chart_util.CHART_DIR / "values.yaml").read_text())
    return set(values)


@dataclass(frozen=True)
class YamlKind:
    """What a YAML block is and how it is checked."""

    kind: str
    """`manifest`: a whole ZeroTrainingJob (validated and run); `spec-fragment`: `spec:` and some of its fields;
    `spec-fields`: fields indented as under `spec:`; `elided-spec`: a whole job's head with `spec: ...` (all three
    laid onto examples/quickstart.yaml and validated); `helm-values`: chart values (rendered); `unknown`."""
    manifest: Obj | None = None
    """The manifest to validate (for the fragments: the quickstart with the fragment laid on)."""
    values: Obj | None = None


def classify(block: Block) -> YamlKind:
    data = yaml.safe_load(block.text)
    first = next((line for line in block.text.splitlines() if line.strip()), "")
    if not isinstance(data, dict):
        return YamlKind("unknown")
    if data.get("apiVersion") == API_VERSION and data.get("kind") == KIND:
        if data.get("spec") == "...":
            head = {k: v for k, v in data.items() if k != "spec"}
            return YamlKind("elided-spec", on_quickstart(head))
        return YamlKind("manifest", data)
    if set(data) == {"spec"} and isinstance(data["spec"], dict):
        return YamlKind("spec-fragment", on_quickstart(data))
    if first.startswith("  ") and not first.startswith("   "):
        return YamlKind("spec-fields", on_quickstart({"spec": data}))
    if set(data) <= chart_value_keys():
        return YamlKind("helm-values", values=data)
    return YamlKind("unknown")


def gpu_count(manifest: Obj) -> int:
    return int(((manifest.get("spec") or {}).get("resources") or {}).get("gpu") or 0)


def ranks(manifest: Obj) -> int:
    spec = manifest.get("spec") or {}
    return int(spec.get("replicas", 1)) * int(spec.get("nprocPerNode", 1))


_validated: dict[str, Ran] = {}


def validate(manifest: Obj | str, scratch: Path, no_import: bool = False) -> Ran:
    """`zerotrain validate` of the manifest (a mapping, or YAML text), once per distinct manifest; `no_import` for a
    fragment naming an entry point of its own (its code and data are the reader's, not in the repository)."""
    text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest, sort_keys=False)
    key = f"{no_import}:{text}"
    if key not in _validated:
        d = scratch / f"validate-{len(_validated)}"
        d.mkdir(parents=True)
        (d / "job.yaml").write_text(text)
        _validated[key] = cli_in_process(["validate", "job.yaml", *(["--no-import"] if no_import else [])], d)
    return _validated[key]


# ---------------------------------------------------------------------------------------------------------------
# Helm


@dataclass
class HelmCommand:
    action: str
    release: str
    chart: Path
    namespace: str = "default"
    values: Obj = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)


HELM_BOOL_FLAGS = {"--create-namespace", "--reuse-values", "--wait", "--atomic", "--install", "--dry-run"}


def parse_helm(argv: list[str]) -> HelmCommand:
    """`helm install|upgrade RELEASE CHART [flags]`: the values its `--set`s (Helm's syntax: `a.b=c`, lists as
    `{x,y}`, several pairs comma-separated) and `-f FILE`s make, over the chart's defaults."""
    assert argv[:1] == ["helm"] and len(argv) >= 4 and argv[1] in ("install", "upgrade"), argv
    positional: list[str] = []
    cmd = HelmCommand(argv[1], "", Path())
    it = iter(argv[2:])
    for word in it:
        if word in ("-n", "--namespace"):
            cmd.namespace = next(it)
        elif word.startswith("--namespace="):
            cmd.namespace = word.split("=", 1)[1]
        elif word in ("--set", "--set-string"):
            for key, value in split_set(next(it)):
                set_path(cmd.values, key, value if word == "--set" else str(value))
        elif word in ("-f", "--values"):
            cmd.values = merge(cmd.values, yaml.safe_load((ROOT / next(it)).read_text()))
        elif word in HELM_BOOL_FLAGS:
            cmd.flags.append(word)
        elif word.startswith("-"):
            raise AssertionError(f"helm flag {word} is not one tests/docs knows how to apply")
        else:
            positional.append(word)
    assert len(positional) == 2, f"expected RELEASE CHART, got {positional}"
    cmd.release, chart = positional
    cmd.chart = (ROOT / chart).resolve()
    return cmd


def split_set(text: str) -> list[tuple[str, Any]]:
    pairs, depth, start = [], 0, 0
    for i, c in enumerate(text + ","):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            key, eq, value = text[start:i].partition("=")
            assert eq and key, f"--set {text}: expected key=value"
            pairs.append((key, helm_value(value)))
            start = i + 1
    return pairs


def helm_value(text: str) -> Any:
    if text.startswith("{") and text.endswith("}"):
        return [helm_value(x) for x in text[1:-1].split(",") if x]
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def set_path(values: Obj, key: str, value: Any) -> None:
    assert "[" not in key, f"--set {key}: list indices are not supported here"
    *parents, last = key.split(".")
    node = values
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def render(cmd: HelmCommand) -> list[Obj]:
    """The chart's objects for the command (an upgrade with --reuse-values over a default install: the defaults
    plus its --set values)."""
    assert cmd.chart == chart_util.CHART_DIR, f"{cmd.chart} is not the repository's chart {chart_util.CHART_DIR}"
    return [
        obj
        for _, obj in chart_util.iter_objects(
            chart_util.render_templates(cmd.values or None, namespace=cmd.namespace, release=cmd.release)
        )
    ]
