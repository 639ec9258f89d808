"""`zerotrain run`: the quickstart trains on 2 local ranks and its loss falls; bad input exits 2 before any rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from budget import budget

from zerotrain.cli import main
from zerotrain.commands.run import RUN_FILE, default_log_dir, effective_job

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


@pytest.mark.slow
def test_quickstart_trains_on_two_ranks_and_the_loss_falls(tmp_path: Path) -> None:
    summary_file = tmp_path / "summary.json"
    argv = ["run", str(QUICKSTART), "--steps", "25", "--summary-file", str(summary_file), "--no-metrics"]
    proc = subprocess.run(
        [sys.executable, "-m", "zerotrain.cli", *argv],
        capture_output=True,
        text=True,
        timeout=budget(240),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(summary_file.read_text())
    assert summary["world_size"] == 2 and summary["stage"] == 3 and len(summary["losses"]) == 25
    assert summary["final_loss"] < summary["first_loss"] - 1.0  # bytes: ln 256 ≈ 5.5 at the start
    for rank, entry in enumerate(summary["ranks"]):
        assert entry["rank"] == rank
        memory = entry["memory"]
        assert memory["parameter_bytes"] == pytest.approx(memory["predicted_parameter_bytes"], rel=0.02)
        assert entry["comm"]["all_gather"]["bytes"] > 0 and entry["comm"]["reduce_scatter"]["bytes"] > 0
    out = proc.stdout
    assert "step 25/25" in out and "memory per rank (stage 3, N = 2)" in out and "reduce_scatter" in out
    assert "succeeded: 2 rank(s) finished (exit status 0)" in out
    assert "holds the gang back" not in out  # two healthy windows name no one


def test_bad_manifest_exits_2_with_the_manifest_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["zero"]["stage"] = 5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["run", str(bad)]) == 2
    assert "spec.zero.stage: got 5" in capsys.readouterr().err


def test_entry_point_that_cannot_be_imported_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["entrypoint"] = "zt_nowhere.model:build"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["run", str(bad), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "spec.entrypoint: got 'zt_nowhere.model:build', but module 'zt_nowhere' cannot be imported" in err


@pytest.mark.parametrize(("flag", "value"), [("--nproc", "0"), ("--steps", "0")])
def test_bad_overrides_exit_2(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(QUICKSTART), flag, value]) == 2
    assert f"{flag}: got {value}; must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["80", "70000"])
def test_metrics_port_out_of_range_exits_2(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(QUICKSTART), "--metrics-port", port]) == 2
    err = capsys.readouterr().err
    assert f"--metrics-port: got {port}; must be 0 (any free ports) or between 1024 and 65535" in err


def test_scrape_config_labels_targets_like_the_pod_monitor() -> None:
    from zerotrain.commands.run_metrics import scrape_config

    config = scrape_config("quickstart", ["127.0.0.1:9400", "127.0.0.1:9401"])
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    assert job["static_configs"] == [
        {"targets": ["127.0.0.1:9400", "127.0.0.1:9401"], "labels": {"zerotrain_job": "quickstart"}}
    ]


@pytest.mark.slow
def test_script_entry_point_runs_as_every_rank_with_spec_env(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "rank = os.environ['RANK']\n"
        "seen = os.environ['ZT_MARK'] + ' ' + os.environ['WORLD_SIZE']\n"
        "open(os.path.join(sys.argv[1], 'rank' + rank), 'w').write(seen)\n"
    )
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"] |= {"entrypoint": str(script), "args": [str(tmp_path)], "env": [{"name": "ZT_MARK", "value": "hi"}]}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "zerotrain.cli", "run", str(job), "--nproc", "3", "--no-metrics"],
        capture_output=True,
        text=True,
        timeout=budget(120),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(tmp_path / f"rank{r}").read_text() for r in range(3)] == ["hi 3"] * 3


@pytest.mark.slow
def test_a_configuration_the_engine_refuses_exits_2(tmp_path: Path) -> None:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["zero"]["unitModules"] = ["Blok"]
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "zerotrain.cli", "run", str(job), "--steps", "2", "--no-metrics"],
        capture_output=True,
        text=True,
        timeout=budget(120),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # Refused once, before any rank starts: the model built on the meta device has no such class.
    assert proc.stderr.count("error: zero.unitModules[0]: got 'Blok'; no module of the model has this class") == 1
    assert "rank" not in proc.stdout and "rank-failed" not in proc.stderr


def test_unknown_entrypoint_args_exit_2_before_any_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["entrypointArgs"]["n_layer"] = 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["run", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "spec.entrypointArgs: got" in err and "'n_layer': 2" in err and "does not accept" in err


def test_no_metrics_reaches_the_ranks_spec() -> None:
    """The ranks read spec.metrics from the job `zerotrain run` hands them: --no-metrics must switch it off there,
    not only in the launcher (they would serve on spec.metrics.port otherwise)."""
    job, _ = effective_job(str(QUICKSTART), None, None, no_metrics=True)
    assert job.spec.metrics.enabled is False
    assert effective_job(str(QUICKSTART), None, None)[0].spec.metrics.enabled is True


def test_log_directories_share_one_parent_and_only_runs_ended_an_hour_ago_go(tmp_path: Path) -> None:
    made = []
    for i in range(5):
        made.append(default_log_dir(f"job{i}", root=tmp_path, keep=2))
        os.utime(made[-1], (1000 + i, 1000 + i))  # distinct ages within one second
        record = made[-1] / RUN_FILE
        ran = json.loads(record.read_text())
        if i == 0:  # still running: this process
            continue
        ago = 2 * 3600 if i < 3 else 12 * 60  # runs 1 and 2 ended two hours ago, 3 and 4 twelve minutes ago
        record.write_text(json.dumps({**ran, "ended": time.time() - ago}))
    default_log_dir("job5", root=tmp_path, keep=2)
    left = {p.name.split("-")[0] for p in tmp_path.iterdir()}
    # Beyond the newest two, only the runs that ended more than an hour ago went: the running one and the two
    # that ended twelve minutes ago stay however old their directories look.
    assert left == {"job0", "job3", "job4", "job5"}, left


@pytest.mark.slow
def test_a_local_run_with_shard_groups_trains_and_says_how_it_sharded(tmp_path: Path) -> None:
    """Four local ranks in two shard groups of two: the whole path from the manifest to the ranks, and the report
    shows the traffic between the groups."""
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["spec"]["zero"]["shardGroupSize"] = 2
    job = tmp_path / "hybrid.yaml"
    job.write_text(yaml.safe_dump(doc))
    summary_file = tmp_path / "summary.json"
    argv = [sys.executable, "-m", "zerotrain.cli", "run", str(job), "--nproc", "4", "--steps", "4"]
    argv += ["--summary-file", str(summary_file), "--no-metrics"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget(300), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(summary_file.read_text())
    assert summary["final_loss"] < summary["first_loss"]
    for entry in summary["ranks"]:
        assert entry["memory"]["shard_group_size"] == 2
        assert entry["comm"]["all_reduce_across_groups"]["bytes"] > 0
    assert "N = 2: 4 ranks in 2 shard groups" in " ".join(proc.stdout.split()), proc.stdout
