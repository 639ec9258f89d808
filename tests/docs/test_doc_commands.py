"""Every command of README.md's and docs/*.md's ```sh, ```bash and ```console blocks (console: the `$ ` lines),
each test named by the file and line, does what the doc says:

Executed for real:
- `zerotrain ...`: the installed CLI, in a fresh scratch directory where the repository's paths (`examples/...`)
  resolve. `zerotrain run` gets `--steps 2` (replacing any `--steps N`), `--log-dir logs`, and `--no-metrics` unless
  the command is about metrics (`--metrics-port`, `--prometheus-config`): then `--metrics-port 0` when the CLI takes
  0 as "any free ports", else a free port from the OS. Placeholders: `job.yaml` is a copy of
  examples/quickstart.yaml, except for the doc's `zerotrain validate job.yaml` that shows errors: there it is
  that manifest with the two mistakes the output names (see INVALID_JOBS). `runs/ckpt` for `zerotrain checkpoint`
  is the checkpoint `zerotrain run job.yaml --checkpoint-dir runs/ckpt --steps 2` writes. A doc's `[--flag]` runs
  without and with the flag. Identical runs run once. The exit status is 0, or 2 where the doc shows `error:`;
  the output the doc shows is what it prints (whitespace aside; `...` elides).
- `helm install|upgrade ... --set ...`: the chart rendered with those values (tests/chart/chart_util.py,
  helm-python-sdk); where the doc shows an `Error:`, the render fails with that message. A `--set X.enabled=true`
  of a monitor renders that object, and its `--set X.labels.K=V` labels it.

Checked statically (no cluster, registry, GPU machine or nested test run here):
- `kubectl apply -f PATH`: PATH exists; its ZeroTrainingJobs pass `zerotrain validate`, a folder's CRDs validate
  as CRDs. `kubectl get|describe ztj [NAME]`: `ztj` is a name of the CRD; NAME a job applied before in the block.
  `kubectl logs -l SELECTOR`: the operator's pods of that job (built by operator/children/builders.py) match SELECTOR.
  `kubectl rollout status deployment/NAME`: the block's `helm install` renders that Deployment in that namespace.
  `kubectl label namespace ... pod-security.kubernetes.io/MODE=LEVEL`: a Pod Security Admission label and level.
- `make TARGET`: `make -n TARGET` resolves it in the Makefile (running it would install or run the whole suite).
- `docker build`: the Dockerfile exists, every `--build-arg` is an `ARG` of it, the context exists, the tag's
  version is zerotrain's (building needs a registry and minutes). `docker push TAG`: a `docker build -t TAG`
  before it in the block builds TAG.
- `prometheus --flag=...`: the installed prometheus has each flag; `--config.file=F` names the file a
  `--prometheus-config F` earlier in the block writes (and the zerotrain run checks that file with promtool).
- `bash SCRIPT ...`: SCRIPT exists and `bash -n` parses it (it is the GPU machine's check).
- `python SCRIPT ...`: a script of the repository (tests/e2e/kueue_env.py, which starts Kueue beside a cluster): its
  --help answers and names the doc's action and flags.
- `pytest PATHS` (`.venv/bin/pytest`): every path exists, and every `NAME=...` before it is a variable those tests
  read (running a test suite from a test would nest suites; the e2e one needs a cluster).

Anything else fails, unless ALLOWED_UNCHECKED (file, command) -> reason lists it: `zerotrain top`, which watches a
live run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from doc_run import (
    QUICKSTART,
    Ran,
    chart_util,
    cli,
    free_port,
    merge,
    metrics_port_zero_supported,
    parse_helm,
    quickstart,
    ranks,
    render,
    scratch_dir,
    validate,
)
from md_extract import ROOT, Command, blocks, commands, doc_files, optional_variants, rel, shown_matches

COMMANDS = [c for f in doc_files() for b in blocks(f) for c in commands(b)]

# (doc, command) -> why it cannot be checked at all.
ALLOWED_UNCHECKED: dict[tuple[str, str], str] = {
    ("docs/monitoring.md", "zerotrain top quickstart"): "watches a run that must be live beside it; "
    "tests/integration/test_top_live.py drives `zerotrain top` in tmux against one",
    ("docs/monitoring.md", "zerotrain top llm-pretrain -n ml --prometheus http://prometheus.monitoring:9090"): "a "
    "cluster's Prometheus; tests/e2e/test_monitoring_e2e.py reads top's series from a real one",
}

# (doc, command) -> what `job.yaml` is laid out of for that command: the doc shows its errors.
INVALID_JOBS: dict[tuple[str, str], dict[str, Any]] = {
    ("docs/manifest.md", "zerotrain validate job.yaml"): {"spec": {"replicas": 0, "replicaz": 2}},
}

CHECKPOINT_RUN = ["zerotrain", "run", "job.yaml", "--checkpoint-dir", "runs/ckpt"]
PORT = "<metrics-port>"


def where(c: Command) -> str:
    return c.where


def doc(c: Command) -> str:
    return rel(c.block.path)


def earlier(c: Command) -> list[Command]:
    return [o for o in COMMANDS if o.block == c.block and o.index < c.index]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("doc-commands")


def test_the_docs_have_commands() -> None:
    programs = {c.program for c in COMMANDS}
    assert {"zerotrain", "helm", "kubectl", "make"} <= programs, programs


def test_the_allow_list_names_commands_that_are_in_the_docs() -> None:
    present = {(doc(c), c.text) for c in COMMANDS}
    assert set(ALLOWED_UNCHECKED) <= present, set(ALLOWED_UNCHECKED) - present
    assert set(INVALID_JOBS) <= {(doc(c), " ".join(c.argv)) for c in COMMANDS}


@pytest.mark.parametrize("cmd", COMMANDS, ids=where)
def test_command(cmd: Command, scratch: Path) -> None:
    if (doc(cmd), cmd.text) in ALLOWED_UNCHECKED:
        pytest.skip(ALLOWED_UNCHECKED[(doc(cmd), cmd.text)])
    handler = HANDLERS.get(cmd.program)
    assert handler, (
        f"{cmd.where}: `{cmd.text}`: tests/docs has no check for `{cmd.program}` commands; add one to "
        "tests/docs/test_doc_commands.py (or, if nothing of it can be checked, to ALLOWED_UNCHECKED with why)"
    )
    handler(cmd, scratch)


# ---------------------------------------------------------------------------------------------------------------
# zerotrain: run for real


@dataclass(frozen=True)
class Prepared:
    args: tuple[str, ...]
    job: str
    """What job.yaml is: `quickstart`, or the JSON of the layer INVALID_JOBS puts on it."""


_runs: dict[Prepared, Ran] = {}


def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    if flag in args:
        i = args.index(flag)
        return [*args[: i + 1], value, *args[i + 2 :]]
    return [*args, flag, value]


def is_metrics_run(args: list[str]) -> bool:
    return args[:1] == ["run"] and bool({"--metrics-port", "--prometheus-config"} & set(args))


def prepare(words: list[str], layer: dict[str, Any] | None) -> Prepared:
    args = list(words[1:])
    if args[:1] == ["run"]:
        args = set_flag(args, "--steps", "2")
        if is_metrics_run(args):
            args = set_flag(args, "--metrics-port", PORT)
        elif "--no-metrics" not in args:
            args.append("--no-metrics")
        if "--log-dir" not in args:
            args += ["--log-dir", "logs"]
    return Prepared(tuple(args), json.dumps(layer, sort_keys=True) if layer else "quickstart")


def execute(p: Prepared, scratch: Path) -> Ran:
    """Run it once per session: the same run shown in two docs runs once."""
    if p in _runs:
        return _runs[p]
    args = list(p.args)
    d = scratch_dir(scratch, "zerotrain", args)
    if "job.yaml" in args:
        layer = None if p.job == "quickstart" else json.loads(p.job)
        text = QUICKSTART.read_text() if layer is None else yaml.safe_dump(merge(quickstart(), layer), sort_keys=False)
        (d / "job.yaml").write_text(text)
    if args[:1] == ["checkpoint"] and any(a == "runs/ckpt" or a.startswith("runs/ckpt/") for a in args):
        made = execute(prepare(CHECKPOINT_RUN, None), scratch)
        assert made.returncode == 0, f"the checkpoint for `zerotrain checkpoint` did not save:\n{made.tail()}"
        (d / "runs").symlink_to(made.cwd / "runs")
    if PORT in args:
        port = "0" if metrics_port_zero_supported(scratch) else str(free_port())
        args = [port if a == PORT else a for a in args]
    _runs[p] = cli(args, d)
    return _runs[p]


def flag_value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    args = list(args)
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def check_zerotrain(cmd: Command, scratch: Path) -> None:
    layer = INVALID_JOBS.get((doc(cmd), " ".join(cmd.argv)))
    expect_error = bool(cmd.output) and cmd.output[0].lower().startswith("error")
    for words in optional_variants(cmd.argv):
        p = prepare(words, layer)
        ran = execute(p, scratch)
        shown = " ".join(["zerotrain", *p.args])
        want = 2 if expect_error else 0
        assert ran.returncode == want, f"{cmd.where}: `{shown}` exited {ran.returncode}, not {want}:\n{ran.tail()}"
        if cmd.output:
            printed = ran.output
            expected = list(cmd.output)
            if is_metrics_run(list(p.args)):  # the doc's ports are examples: any free ones will do
                printed = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", printed)
                expected = [re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", x) for x in expected]
            if cmd.block.lang != "console":  # a shell block's `#   ...` comment quotes some of what it prints
                expected = ["...", *expected, "..."]
            diff = shown_matches(expected, printed)
            assert diff is None, f"{cmd.where}: `{shown}` does not print what the doc shows: {diff}"
        check_effects(cmd, p, ran)


def check_effects(cmd: Command, p: Prepared, ran: Ran) -> None:
    """What the command leaves behind, where the doc says it leaves something."""
    args = list(p.args)
    if ran.returncode != 0:
        return
    if args[:1] == ["validate"]:
        assert "is valid" in ran.stdout, ran.output
    if args[:1] == ["run"]:
        if ckpt := flag_value(args, "--checkpoint-dir"):
            committed = list((ran.cwd / ckpt).glob("*/COMMITTED"))
            assert committed, f"{cmd.where}: no committed checkpoint under {ckpt}:\n{ran.tail()}"
        if config := flag_value(args, "--prometheus-config"):
            path = ran.cwd / config
            assert path.exists(), f"{cmd.where}: {config} was not written:\n{ran.tail()}"
            targets = yaml.safe_load(path.read_text())["scrape_configs"][0]["static_configs"][0]["targets"]
            nproc = int(flag_value(args, "--nproc") or ranks(yaml.safe_load((ran.cwd / args[1]).read_text())))
            assert len(targets) == nproc, targets
            if shutil.which("promtool"):
                check = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True)
                assert check.returncode == 0, check.stdout + check.stderr
    if args[:2] == ["checkpoint", "inspect"] and flag_value(args, "--output") == "json":
        json.loads(ran.stdout)
    if args[:2] == ["checkpoint", "export"] and (out := flag_value(args, "--out")):
        assert (ran.cwd / out).exists(), f"{cmd.where}: {out} was not written:\n{ran.tail()}"


# ---------------------------------------------------------------------------------------------------------------
# helm: rendered

HELM_CLI_PREFIX = re.compile(r"^Error: (INSTALLATION|UPGRADE) FAILED: ")


def check_helm(cmd: Command, scratch: Path) -> None:
    h = parse_helm(cmd.argv)
    if cmd.output and cmd.output[0].startswith("Error:"):
        # The helm binary prefixes the chart's error with "Error: INSTALLATION FAILED: "; the SDK raises the error.
        with pytest.raises(Exception) as failed:
            render(h)
        shown = [HELM_CLI_PREFIX.sub("", cmd.output[0]), *cmd.output[1:]]
        diff = shown_matches(shown, str(failed.value))
        assert diff is None, f"{cmd.where}: the chart's error is not the one the doc shows: {diff}"
        return
    objects = render(h)
    assert any(o["kind"] == "Deployment" for o in objects), f"{cmd.where}: no Deployment rendered"
    kinds = {kind for _, kind in chart_util.OPTIONAL_KINDS}
    for word in cmd.argv:
        m = re.fullmatch(r"([a-z][A-Za-z]*)\.(enabled=true|labels\.([\w./-]+)=(.*))", word)
        kind = m and m[1][0].upper() + m[1][1:]
        if not m or kind not in kinds:
            continue
        found = [o for o in objects if o["kind"] == kind]
        assert found, f"{cmd.where}: --set {word} renders no {kind}"
        if m[3]:
            labels = found[0]["metadata"].get("labels") or {}
            assert labels.get(m[3]) == m[4], f"{cmd.where}: --set {word}: the {kind} has labels {labels}"


# ---------------------------------------------------------------------------------------------------------------
# kubectl: static


def kubectl_words(argv: list[str]) -> tuple[list[str], str | None]:
    """The words without `-n NS` / `--namespace NS`, and NS."""
    out, ns, it = [], None, iter(argv[1:])
    for w in it:
        if w in ("-n", "--namespace"):
            ns = next(it)
        elif w.startswith("--namespace="):
            ns = w.split("=", 1)[1]
        else:
            out.append(w)
    return out, ns


def crd() -> dict[str, Any]:
    text = (ROOT / "crds" / "zerotrainingjobs.zerotrain.dev.yaml").read_text()
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def applied_jobs(cmd: Command) -> dict[str, dict[str, Any]]:
    """name -> manifest of every ZeroTrainingJob a `kubectl apply -f` before `cmd` in its block applied."""
    jobs = {}
    for o in earlier(cmd):
        words, _ = kubectl_words(o.argv)
        if o.program == "kubectl" and words[:1] == ["apply"] and (path := flag_value(words, "-f")):
            target = ROOT / path
            files = sorted(target.glob("*.yaml")) if target.is_dir() else [target]
            for f in files:
                for d in yaml.safe_load_all(f.read_text()):
                    if isinstance(d, dict) and d.get("kind") == "ZeroTrainingJob":
                        jobs[d["metadata"]["name"]] = d
    return jobs


def check_kubectl(cmd: Command, scratch: Path) -> None:
    words, ns = kubectl_words(cmd.argv)
    verb = words[0]
    names = crd()["spec"]["names"]
    resource_names = {names["plural"], names["singular"], names["kind"].lower(), *names.get("shortNames", [])}
    if verb == "apply":
        path = flag_value(words, "-f")
        assert path, f"{cmd.where}: kubectl apply without -f"
        target = ROOT / path
        assert target.exists(), f"{cmd.where}: {path} does not exist"
        if target.is_dir():
            import kubernetes_validate

            files = sorted(target.glob("*.yaml"))
            assert files, f"{cmd.where}: {path} holds no YAML"
            for f in files:
                obj = yaml.safe_load(f.read_text())
                assert obj["kind"] == "CustomResourceDefinition", f"{cmd.where}: {f} is a {obj['kind']}"
                kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
            return
        jobs = [d for d in yaml.safe_load_all(target.read_text()) if isinstance(d, dict)]
        assert jobs, f"{cmd.where}: {path} holds no object"
        for d in jobs:
            assert d.get("kind") == "ZeroTrainingJob", f"{cmd.where}: {path}: no check for a {d.get('kind')}"
            ran = validate(d, scratch)
            assert ran.returncode == 0, f"{cmd.where}: {path} is invalid:\n{ran.tail()}"
        return
    if verb in ("get", "describe"):
        assert words[1] in resource_names, f"{cmd.where}: {words[1]} is none of the CRD's names {resource_names}"
        if verb == "describe":
            applied = applied_jobs(cmd)
            assert words[2] in applied, f"{cmd.where}: no job {words[2]} applied before it in the block: {applied}"
        return
    if verb == "logs":
        selector = flag_value(words, "-l")
        assert selector, f"{cmd.where}: kubectl logs without -l"
        wanted = dict(part.split("=", 1) for part in selector.split(","))
        from zerotrain.operator.children.builders import JobRef, build_pods
        from zerotrain.spec import ZeroTrainingJobSpec

        matched = []
        for name, job in applied_jobs(cmd).items():
            pods = build_pods(JobRef(name, ns or "default", "uid"), ZeroTrainingJobSpec.model_validate(job["spec"]), 0)
            if all(wanted.items() <= p["metadata"]["labels"].items() for p in pods):
                matched.append(name)
        assert matched, f"{cmd.where}: the pods of no job applied before it carry {wanted}"
        return
    if verb == "rollout":
        assert words[1] == "status", words
        kind, _, name = words[2].partition("/")
        helm = [o for o in earlier(cmd) if o.program == "helm"]
        assert helm, f"{cmd.where}: no helm install before it in the block says what {words[2]} is"
        h = parse_helm(helm[-1].argv)
        assert ns in (None, h.namespace), f"{cmd.where}: -n {ns}, but the chart was installed in {h.namespace}"
        found = [o for o in render(h) if o["kind"].lower() == kind and o["metadata"]["name"] == name]
        assert found, f"{cmd.where}: the chart renders no {words[2]}"
        assert found[0]["metadata"].get("namespace", h.namespace) == h.namespace
        return
    if verb == "label":
        assert words[1] in ("namespace", "ns"), f"{cmd.where}: no check for labelling a {words[1]}"
        for w in words[3:]:
            if w.startswith("-"):
                assert w == "--overwrite", w
                continue
            key, _, value = w.partition("=")
            assert re.fullmatch(r"pod-security\.kubernetes\.io/(enforce|audit|warn)", key), f"{cmd.where}: {key}"
            assert value in ("privileged", "baseline", "restricted"), f"{cmd.where}: {value}"
        return
    raise AssertionError(f"{cmd.where}: no check for `kubectl {verb}`; add one to tests/docs/test_doc_commands.py")


# ---------------------------------------------------------------------------------------------------------------
# other tools: static


def check_make(cmd: Command, scratch: Path) -> None:
    targets = [w for w in cmd.argv[1:] if not w.startswith("-") and "=" not in w]
    assert targets, cmd.text
    p = subprocess.run(["make", "-n", "-C", str(ROOT), *targets], capture_output=True, text=True, check=False)
    assert p.returncode == 0, f"{cmd.where}: `make -n {' '.join(targets)}`: {p.stderr}"


def check_docker(cmd: Command, scratch: Path) -> None:
    import zerotrain

    words = cmd.argv[1:]
    if words[0] == "push":
        built = [flag_value(o.argv, "-t") for o in earlier(cmd) if o.program == "docker" and o.argv[1:2] == ["build"]]
        assert words[1:] and words[1] in built, f"{cmd.where}: no `docker build -t {words[1:]}` before it in the block"
        return
    assert words[0] == "build", f"{cmd.where}: no check for `docker {words[0]}`"
    dockerfile = ROOT / (flag_value(words, "-f") or "Dockerfile")
    assert dockerfile.exists(), f"{cmd.where}: {dockerfile.name} does not exist"
    declared = set(re.findall(r"^ARG\s+(\w+)", dockerfile.read_text(), flags=re.M))
    positional, i = [], 1
    while i < len(words):
        if words[i] in ("-f", "-t", "--tag", "--build-arg", "--target", "--platform"):
            if words[i] == "--build-arg":
                arg = words[i + 1].split("=")[0]
                assert arg in declared, f"{cmd.where}: --build-arg {arg}: {dockerfile.name} declares {declared}"
            if words[i] in ("-t", "--tag"):
                version = words[i + 1].rsplit(":", 1)[1]
                assert version.split("-")[0] == zerotrain.__version__, f"{cmd.where}: tag {words[i + 1]}"
            i += 2
        else:
            assert not words[i].startswith("-"), f"{cmd.where}: no check for docker build {words[i]}"
            positional.append(words[i])
            i += 1
    assert len(positional) == 1 and (ROOT / positional[0]).is_dir(), f"{cmd.where}: context {positional}"


def check_prometheus(cmd: Command, scratch: Path) -> None:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.skip("prometheus is not installed (`make system-deps` installs it): its flags cannot be checked")
    help_text = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
    help_text += subprocess.run([exe, "--help"], capture_output=True, text=True).stderr
    for w in cmd.argv[1:]:
        flag = w.split("=")[0]
        assert re.search(rf"(^|\s){re.escape(flag)}[=\s]", help_text), f"{cmd.where}: prometheus has no {flag}"
        if flag == "--config.file":
            config = w.split("=", 1)[1]
            writers = [o for o in earlier(cmd) if flag_value(o.argv, "--prometheus-config") == config]
            assert writers, f"{cmd.where}: nothing before it in the block writes {config}"


def check_bash(cmd: Command, scratch: Path) -> None:
    script = ROOT / cmd.argv[1]
    assert script.exists(), f"{cmd.where}: {cmd.argv[1]} does not exist"
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, f"{cmd.where}: bash -n {cmd.argv[1]}: {p.stderr}"


def check_python(cmd: Command, scratch: Path) -> None:
    """`python SCRIPT ACTION --flag ...` of a script of the repository: its --help answers, and names the action and
    every flag the doc uses (running it would start servers beside a cluster the suite does not have)."""
    script = ROOT / cmd.argv[1]
    assert script.is_file(), f"{cmd.where}: {cmd.argv[1]} does not exist"
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, f"{cmd.where}: {cmd.argv[1]} --help: {p.stderr}"
    for word in cmd.argv[2:]:
        if word.startswith("--") or not word.startswith(("-", "~", "/")):
            assert word.split("=")[0] in p.stdout, f"{cmd.where}: {cmd.argv[1]} takes no {word}:\n{p.stdout}"


def check_pytest(cmd: Command, scratch: Path) -> None:
    paths = [ROOT / w.split("::")[0] for w in cmd.argv[1:] if not w.startswith("-")]
    assert paths, cmd.text
    for p in paths:
        assert p.exists(), f"{cmd.where}: {rel(p)} does not exist"
    sources = "".join(f.read_text() for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.py"))))
    for name in cmd.env:
        assert name in sources, f"{cmd.where}: {name}: none of {[rel(p) for p in paths]} reads it"


HANDLERS: dict[str, Any] = {
    "zerotrain": check_zerotrain,
    "helm": check_helm,
    "kubectl": check_kubectl,
    "make": check_make,
    "docker": check_docker,
    "prometheus": check_prometheus,
    "bash": check_bash,
    "pytest": check_pytest,
    "python": check_python,
}
