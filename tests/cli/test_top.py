"""`zerotrain top`: its view from a source's series (within 80 columns, the split since the last refresh, the
straggler mark, the operator's ledger before rank 0's), and one line and exit status 2 for a job with no run, a
run with metrics off and a Prometheus that does not answer. tests/integration/test_top_live.py drives it live."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from rich.console import Console

from zerotrain.cli import main
from zerotrain.commands.run import default_log_dir
from zerotrain.monitoring import top_view
from zerotrain.monitoring.top_sources import Sample


def rank_series(rank: int, compute: float, data: float, wait: float, straggler: bool = False) -> list[Sample]:
    labels = {"rank": str(rank)}
    phases = {"data_wait": data, "compute": compute, "collective_wait": wait, "checkpoint": 0.0, "evaluation": 0.0}
    out = [Sample("zerotrain_step_phase_seconds_total", labels | {"phase": p}, v) for p, v in phases.items()]
    out += [
        Sample("zerotrain_memory_bytes", labels | {"category": "parameters"}, 1_000_000),
        Sample("zerotrain_memory_bytes", labels | {"category": "activations"}, 9_000_000),  # not a model state
        Sample("zerotrain_memory_predicted_bytes", labels | {"category": "parameters"}, 1_000_000),
        Sample("zerotrain_tokens_per_second", labels, 12_345.0),
        Sample("zerotrain_straggler", labels | {"cause": "input"}, 1.0 if straggler else 0.0),
        Sample("zerotrain_step", labels, 40.0),
        Sample("zerotrain_training_steps", labels, 300.0),
        Sample("zerotrain_goodput_seconds", labels | {"bucket": "training"}, 30.0),
        Sample("zerotrain_goodput_seconds", labels | {"bucket": "starting"}, 10.0),
    ]
    if straggler:
        out.append(Sample("zerotrain_straggler_ratio", labels | {"cause": "input"}, 1.52))
    return out


def test_the_view_splits_the_time_since_the_last_refresh_and_fits_eighty_columns() -> None:
    before = rank_series(0, 10, 0, 10) + rank_series(1, 10, 10, 0)
    now = rank_series(0, 11, 0, 3 + 10) + rank_series(1, 11, 10 + 3, 0, straggler=True)
    view = top_view.build("llm", "local", now, before)
    zero, one = view.ranks
    assert zero.split == pytest.approx({"data": 0, "compute": 0.25, "wait": 0.75, "other": 0})
    assert one.split == pytest.approx({"data": 0.75, "compute": 0.25, "wait": 0, "other": 0})
    assert (zero.memory, zero.plan, zero.straggler, one.straggler) == (1e6, 1e6, "", "input 1.52×")
    assert (view.step, view.steps) == (40, 300) and view.goodput is not None and view.goodput.training == 30
    console = Console(width=80, record=True, color_system=None)
    console.print(top_view.render(view))
    screen = console.export_text()
    assert "input 1.52×" in screen and "goodput 75.0% of 40.0 s" in screen, screen
    assert "step 40/300  eta 3m" in screen, screen  # 260 steps left at 40 steps per 30 s of training
    assert max(len(line) for line in screen.splitlines()) <= 80, screen


def test_a_cluster_job_shows_the_operators_ledger() -> None:
    operator = [
        Sample("zerotrain_operator_job_goodput_seconds", {"bucket": "training"}, 50.0),
        Sample("zerotrain_operator_job_goodput_seconds", {"bucket": "lost"}, 50.0),
    ]
    view = top_view.build("llm", "ns via prometheus", rank_series(0, 1, 1, 1) + operator)
    assert view.goodput is not None and (view.goodput.training, view.goodput.lost) == (50, 50)


def test_a_job_with_no_local_run_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "nosuch", "--log-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no local run of job 'nosuch'" in err and len(err.strip().splitlines()) == 1, err


def test_a_run_with_metrics_off_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    default_log_dir("quiet", tmp_path)  # what `zerotrain run --no-metrics` leaves: logs, no record of endpoints
    assert main(["top", "quiet", "--log-dir", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "job 'quiet' has no local run serving metrics" in err and "metrics off" in err, err


def test_a_prometheus_that_does_not_answer_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port the system gave and nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert main(["top", "llm", "--prometheus", url]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--prometheus: {url} does not answer" in err, err


def test_a_run_is_found_from_the_directory_it_was_started_in_never_another_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import os

    from zerotrain.errors import UserError
    from zerotrain.monitoring.top_sources import RUN_RECORD, find_local_run

    monkeypatch.setattr("zerotrain.monitoring.top_sources.log_root", lambda: tmp_path / "logs")
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for started_in, port in ((theirs, 9001), (mine, 9002), (theirs, 9003)):
        started_in.mkdir(exist_ok=True)
        monkeypatch.chdir(started_in)
        d = default_log_dir("quickstart", tmp_path / "logs")
        record = {"job": "quickstart", "pid": os.getpid(), "cwd": str(started_in), "targets": [f"127.0.0.1:{port}"]}
        (d / RUN_RECORD).write_text(json.dumps(record))
        os.utime(d, (port, port))  # started in this order
    monkeypatch.chdir(mine)
    assert find_local_run("quickstart").targets == ["127.0.0.1:9002"]  # not the newer one started elsewhere
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as refused:
        find_local_run("quickstart")
    said = str(refused.value)
    assert f"no local run started from this directory ({tmp_path})" in said and "--log-dir" in said, said
    assert said.count("started from") == 4, said  # the three runs, each with where it was started
