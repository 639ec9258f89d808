"""bench/gpu/gpu_check.py, gpu_check.sh, gpu_throughput.py and gpu_bundle.py: the CPU path of every check runs and
passes, an injected fault fails it, and the bundle picks, pins and verifies what a bare GPU machine installs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from budget import budget

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "gpu"
sys.path[:0] = [str(BENCH), str(BENCH.parent / "compare")]

import gpu_bundle  # noqa: E402
import gpu_check  # noqa: E402
import gpu_check_config  # noqa: E402
import gpu_check_driver  # noqa: E402
import gpu_check_parity  # noqa: E402
import gpu_check_procs  # noqa: E402
import gpu_check_records  # noqa: E402
import gpu_check_sanitizer  # noqa: E402
import gpu_check_train  # noqa: E402
import gpu_throughput  # noqa: E402

from zerotrain.runtime.examples.gpt import GPT  # noqa: E402


def _check(args: list[str], timeout: float = 240) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = Path(args[args.index("--out") + 1])
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--device", "cpu", "--quick", *args],
        capture_output=True,
        text=True,
        timeout=budget(timeout),
    )
    doc = json.loads((out / "gpu_check.json").read_text())
    return proc, doc


def _by_status(doc: dict[str, Any], status: str) -> set[str]:
    return {f"{r['phase']}: {r['name']}" for r in doc["checks"] if r["status"] == status}


@pytest.mark.slow
def test_cpu_path_runs_every_phase_and_passes(tmp_path: Path) -> None:
    proc, doc = _check(["--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert doc["ok"] and doc["counts"]["FAILED"] == 0
    assert list(doc["phases"]) == list(gpu_check_config.PHASES)
    assert not any(p["timed_out"] for p in doc["phases"].values())
    passed = _by_status(doc, "ok")
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor SUM", "reduce_scatter_tensor AVG", "all_reduce AVG"):
        assert f"collectives: {op} (1 rank)" in passed
        assert f"two_ranks: {op} (2 ranks)" in passed  # gloo runs two ranks for real
    assert "collectives: engine stage 3, world 1, ZEROTRAIN_SINGLE_RANK_COLLECTIVES=1" in passed
    assert "collectives: engine stage 3, world 1, variable unset" in passed
    for stage in range(4):
        for variant in ("", " chunked", " overlapComm false"):
            assert f"parity: fp32 stage {stage}{variant} vs AdamW (world 1)" in passed
        assert f"allocator: bf16 stage {stage}" in passed
    assert "parity: bf16 stage 3 vs bf16 stage 0 (world 1)" in passed
    assert "two_ranks: fp32 stage 3 chunked vs AdamW (2 ranks)" in passed
    assert {"throughput: zero3 (zerotrain stage 3)", "throughput: fsdp2 (FSDP2 (reshard after forward))"} <= passed
    # The sanitizer's runs happen on the CPU too; CSAN itself only watches CUDA streams.
    assert "sanitizer: bf16 stage 3 ran" in passed
    for run in ("zero3 offload optimizer", "zero3 offload all"):
        assert {f"offload: {run}: memory", f"offload: {run}: losses"} <= passed
    assert "offload: zero3 offload all: parameters off the device" in passed
    skipped = {"sanitizer: sanitized run", "sanitizer: CSAN catches a planted race", "device: device terms"}
    assert _by_status(doc, "skipped") == skipped | {"offload: fsdp2 CPUOffloadPolicy"}  # CUDA only
    # One printed line per check, and every phase's own log kept.
    assert sum(ln.lstrip().startswith(("ok ", "skipped ")) for ln in proc.stdout.splitlines()) == len(doc["checks"])
    assert {f"{p}.log" for p in gpu_check_config.PHASES} <= {p.name for p in (tmp_path / "phases").iterdir()}
    results = json.loads((tmp_path / "throughput.json").read_text())["results"]
    assert [r["system"] for r in results] == ["zero3", "fsdp2"] and all(r["tokens_per_second"] > 0 for r in results)


def test_a_wrong_reference_fails_the_parity_checks(tmp_path: Path) -> None:
    proc, doc = _check(["--out", str(tmp_path), "--phases", "parity", "--inject", "parity-reference"])
    assert proc.returncode == 1, proc.stdout[-3000:]
    failed = _by_status(doc, "FAILED")
    # Every comparison against the perturbed fp32 reference and the perturbed bf16 stage 0 fails ...
    assert len([f for f in failed if "vs AdamW" in f]) == 12 + 2  # and the two under the delayed side stream
    assert len([f for f in failed if "vs bf16 stage 0" in f]) == 7
    # ... and nothing else: bf16 stage 0 against AdamW compares losses, which the fault leaves alone.
    assert _by_status(doc, "ok") == {"environment: torch", "parity: bf16 stage 0 vs fp32 AdamW (world 1)"}
    assert "gpu_check: FAILED" in proc.stdout


def test_a_wrong_collective_result_fails_only_that_check(tmp_path: Path) -> None:
    proc, doc = _check(["--out", str(tmp_path), "--phases", "collectives", "--inject", "collective-result"])
    assert proc.returncode == 1
    assert _by_status(doc, "FAILED") == {"collectives: all_gather_into_tensor (1 rank)"}
    assert "WRONG" in next(r["detail"] for r in doc["checks"] if r["status"] == "FAILED")


def test_a_phase_that_breaks_or_hangs_is_a_failed_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = gpu_check.parse_args(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    (tmp_path / "phases").mkdir()
    sink = gpu_check_records.Checks("collectives", None)
    info = gpu_check_driver.run_phase(args, "collectives", 0.5, sink)  # far too short: killed
    assert info["timed_out"] and sink.records[-1]["status"] == "FAILED" and "timed out" in sink.records[-1]["detail"]
    monkeypatch.setattr(gpu_check_procs, "child_args", lambda a: ["--device", "cuda-nonexistent"])
    sink = gpu_check_records.Checks("collectives", None)
    info = gpu_check_driver.run_phase(args, "collectives", 60, sink)
    assert info["exit_status"] == 2 and "exited with status 2" in sink.records[-1]["detail"]


def test_the_sanitizer_verdict_fails_on_a_race_report_a_crash_or_a_hang() -> None:
    report = (
        "============================\n"
        "CSAN detected a possible data race on tensor with data pointer 140\n"
        "Access by stream 94 during kernel:\naten::mul.Tensor(Tensor self, Tensor other) -> Tensor\n"
        "reading from argument(s) self\n"
        "Previous access by stream 0 during kernel:\naten::fill_.Scalar(Tensor(a!) self, Scalar value)\n"
    )
    ok, detail = gpu_check_sanitizer.sanitizer_verdict(0, "training ...\n" + report)
    assert not ok and "aten::mul.Tensor" in detail and "aten::fill_.Scalar" in detail
    assert gpu_check_sanitizer.sanitizer_verdict(0, "all fine\n") == (True, "no race reported")
    assert not gpu_check_sanitizer.sanitizer_verdict(1, "RuntimeError: boom\n")[0]
    assert gpu_check_sanitizer.sanitizer_verdict(None, "")[1] == "timed out"


def test_bf16_tolerance_catches_an_update_off_by_its_own_size() -> None:
    init = {"w": torch.zeros(100)}
    base = gpu_check_train.Trained([5.0], [1.0], {"w": torch.full((100,), 1e-3)})
    near = gpu_check_train.Trained([5.0], [1.0], {"w": torch.full((100,), 1e-3) * (1 + 2**-8)})
    doubled = gpu_check_train.Trained([5.0], [1.0], {"w": torch.full((100,), 2e-3)})
    assert gpu_check_parity.worst_update(near, base, init)[0] <= gpu_check_config.BF16_UPDATE_RTOL
    assert gpu_check_parity.worst_update(doubled, base, init) == (pytest.approx(1.0), "w")


def test_throughput_losses_that_leave_fsdp2s_fail_and_the_model_is_a_billion_parameters() -> None:
    def result(system: str, losses: list[float]) -> dict[str, Any]:
        return {
            "system": system, "label": gpu_throughput.LABELS[system], "world": 1, "losses": losses, "mfu": 0.4,
            "tokens_per_second": 1e5, "step_seconds": 0.16, "cuda_peak_allocated_bytes": 4e10,
        }  # fmt: skip

    good = [result("fsdp2", [5.5, 5.0]), result("zero3", [5.5, 5.01])]
    cfg = {"d_model": 2048, "layers": 20, "seq_len": 1024, "batch": 16, "precision": "bf16", "atol": 5e-2}
    cfg |= {"min_params": 10**9, "peak_tflops": 790.0}
    assert gpu_throughput.agreement(good, 5e-2) == {}
    assert all(ok for _, ok, _, _ in gpu_throughput.checks({"config": cfg, "results": good, "failures": {}}))
    bad = [result("fsdp2", [5.5, 5.0]), result("zero3", [5.5, 5.2])]
    failures = gpu_throughput.agreement(bad, 5e-2)
    assert list(failures) == ["zero3"] and "step 1" in failures["zero3"]
    by_name = {n: ok for n, ok, _, _ in gpu_throughput.checks({"config": cfg, "results": bad, "failures": failures})}
    assert by_name["zero3 (zerotrain stage 3)"] is False and by_name["fsdp2 (FSDP2 (reshard after forward))"]
    # The formula is the real model's count, and the GPU preset is at least a billion parameters.
    assert gpu_throughput.parameter_count(2048, 20, 1024) == 1_009_790_976
    with torch.device("meta"):
        small = GPT(seq_len=32, d_model=64, n_layers=3, n_heads=4)
        large = GPT(seq_len=1024, d_model=2048, n_layers=20, n_heads=16)
    assert sum(p.numel() for p in small.parameters()) == gpu_throughput.parameter_count(64, 3, 32)
    assert sum(p.numel() for p in large.parameters()) == 1_009_790_976
    assert "--d-model 2048 --layers 20" in gpu_check_config.SIZES["cuda"].throughput
    assert gpu_check_config.SIZES["cuda"].min_params == 10**9


# --- the bundle ---------------------------------------------------------------------------------------------------


def _fake_bundle(path: Path, wheels: dict[str, str], sources: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    listed = []
    for name, version in wheels.items():
        file = path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        file.write_bytes(f"{name} {version}".encode())
        listed.append({"file": file.name, "name": name, "version": version, "sha256": gpu_bundle.sha256(file)})
    (path / "bundle.json").write_text(json.dumps({"wheels": listed, "sources": sources or {}}))
    return path


def test_select_installs_zerotrain_and_what_is_absent_or_older(tmp_path: Path) -> None:
    import pytest as installed

    bundle = _fake_bundle(
        tmp_path / "b",
        {"zerotrain": "0.1.0", "pytest": "0.1", "definitely-not-installed-zt": "1.0", "typing-extensions": "999.0"},
    )
    picked = {gpu_bundle.wheel_name_version(p)[0] for p in gpu_bundle.select(bundle)}
    assert gpu_bundle.release(installed.__version__) > (0, 1)
    assert picked == {"zerotrain", "definitely-not-installed-zt", "typing-extensions"}
    (bundle / "pytest-0.1-py3-none-any.whl").write_bytes(b"changed")
    with pytest.raises(SystemExit, match=r"not the file bundle\.json lists"):
        gpu_bundle.select(bundle)


def test_verify_fails_when_the_checkout_differs_from_the_bundled_sources(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    for rel in ("runtime/zero/engine.py", "operator/main.py", "zerotrain/py.typed", "runtime/__pycache__/x.py"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_text(rel)
    sources = gpu_bundle.source_files(checkout)
    assert set(sources) == {"runtime/zero/engine.py", "operator/main.py", "zerotrain/py.typed"}
    bundle = _fake_bundle(tmp_path / "b", {"zerotrain": "0.1.0"}, sources)
    assert gpu_bundle.stale_sources(bundle, checkout) == []
    assert gpu_bundle.main(["verify", str(bundle), "--checkout", str(checkout)]) == 0
    (checkout / "runtime/zero/engine.py").write_text("changed")
    (checkout / "runtime/new.py").write_text("new")
    assert gpu_bundle.stale_sources(bundle, checkout) == ["runtime/new.py", "runtime/zero/engine.py"]
    assert gpu_bundle.main(["verify", str(bundle), "--checkout", str(checkout)]) == 1


def test_the_bundle_pins_pydantic_and_its_requirements_and_never_torch() -> None:
    closure = gpu_bundle.requirement_closure(gpu_bundle.RUNTIME_ROOTS)
    assert {"pydantic", "pydantic-core", "annotated-types", "typing-extensions", "typing-inspection"} <= set(closure)
    assert not set(closure) & {"torch", "kopf", "kubernetes", "numpy"}
    from importlib.metadata import version

    assert closure["pydantic"] == version("pydantic")  # the version the tests run with


@pytest.mark.slow
def test_the_zerotrain_wheel_holds_every_source_file_at_its_package_path(tmp_path: Path) -> None:
    wheel = gpu_bundle.build_wheel(tmp_path, sys.executable)
    sources = gpu_bundle.source_files(ROOT)
    gpu_bundle.check_wheel_has_sources(wheel, sources)  # raises naming what is missing
    assert "runtime/zero/engine.py" in sources and "zerotrain/py.typed" in sources


# --- the shell script -----------------------------------------------------------------------------------------------


def _sh(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(BENCH / "gpu_check.sh"), *args], capture_output=True, text=True, timeout=budget(120), env=env
    )


def test_the_script_writes_its_log_and_results_and_exits_with_the_checks_status(tmp_path: Path) -> None:
    proc = _sh(str(tmp_path / "a"), "--device", "cpu", "--no-bundle", "--quick", "--phases", "collectives")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert json.loads((tmp_path / "a" / "gpu_check.json").read_text())["ok"]
    log = (tmp_path / "a" / "gpu_check.log").read_text()
    assert "collectives: all_reduce SUM (1 rank)" in log and "exit status 0" in log
    proc = _sh(str(tmp_path / "b"), "--device", "cpu", "--no-bundle", "--quick", "--phases", "collectives",
               "--inject", "collective-result")  # fmt: skip
    assert proc.returncode == 1 and "FAILED  collectives: all_gather_into_tensor" in proc.stdout


def test_the_script_without_a_bundle_says_how_to_make_one(tmp_path: Path) -> None:
    proc = _sh(str(tmp_path), "--device", "cpu", "--bundle", str(tmp_path / "none"))
    assert proc.returncode == 2 and "make gpu-bundle" in proc.stdout
    assert "make gpu-bundle" in json.loads((tmp_path / "gpu_check.json").read_text())["setup_error"]


@pytest.mark.slow
def test_the_script_installs_the_wheel_imports_it_and_refuses_one_of_other_sources(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    wheel = gpu_bundle.build_wheel(bundle, sys.executable)  # the dependencies are this environment's own
    sources = gpu_bundle.source_files(ROOT)
    entry = {"file": wheel.name, "name": "zerotrain", "version": "0.1.0", "sha256": gpu_bundle.sha256(wheel)}
    (bundle / "bundle.json").write_text(json.dumps({"wheels": [entry], "sources": sources}))
    proc = _sh(str(tmp_path / "a"), "--device", "cpu", "--bundle", str(bundle), "--quick", "--phases", "collectives")
    assert proc.returncode == 0, proc.stdout[-3000:]
    doc = json.loads((tmp_path / "a" / "gpu_check.json").read_text())
    passed = _by_status(doc, "ok")
    # Imported from the folder pip installed the wheel into, ahead of this environment's editable install.
    assert {"environment: zerotrain from the bundle", "environment: torch is the machine's own"} <= passed
    assert "zerotrain wheel matches the checkout" in proc.stdout
    sources["runtime/zero/engine.py"] = hashlib.sha256(b"another engine").hexdigest()
    (bundle / "bundle.json").write_text(json.dumps({"wheels": [entry], "sources": sources}))
    proc = _sh(str(tmp_path / "b"), "--device", "cpu", "--bundle", str(bundle), "--quick", "--phases", "collectives")
    assert proc.returncode == 2 and "not this checkout's code" in proc.stdout
    assert "runtime/zero/engine.py" in proc.stdout
