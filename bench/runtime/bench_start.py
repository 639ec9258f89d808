"""How long a run takes to start: from `zerotrain run` to the quickstart's first step (the goodput ledger's
starting bucket), with ranks forked from the preloaded server (the default) and spawned as fresh interpreters
(ZEROTRAIN_RANK_START=spawn, as before), interleaved, beside one process's `import torch, zerotrain.runtime`.

    python bench/runtime/bench_start.py              # 5 rounds; medians with their range
    python bench/runtime/bench_start.py --repeats 7 --json out.json

The goal it is held to (issue 60): forked ranks start within 1.3 × one import plus 1.5 s for the rendezvous and
the model's construction. Figures are this machine's: compare them within one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
WAYS = ("forkserver", "spawn")


def starting(way: str, steps: int = 3) -> float:
    """Seconds in the starting bucket of one quickstart run started `way`."""
    with tempfile.TemporaryDirectory() as d:
        summary = Path(d, "summary.json")
        env = {**os.environ, "ZEROTRAIN_RANK_START": way, "PYTHONSAFEPATH": "1"}
        argv = [sys.executable, "-m", "zerotrain.cli", "run", str(QUICKSTART), "--steps", str(steps), "--no-metrics"]
        argv += ["--summary-file", str(summary), "--log-dir", str(Path(d, "logs"))]
        subprocess.run(argv, env=env, check=True, capture_output=True, cwd=d)
        return float(json.loads(summary.read_text())["goodput"]["starting"])


def one_import() -> float:
    """Seconds for a fresh interpreter to import torch and zerotrain's runtime (the example GPT with it)."""
    start = time.perf_counter()
    code = "import torch, zerotrain.runtime.examples.gpt"
    subprocess.run([sys.executable, "-P", "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"import": [], **{w: [] for w in WAYS}}
    for _ in range(args.repeats):  # interleaved: the machine's drift falls on both alike
        figures["import"].append(one_import())
        for way in WAYS:
            figures[way].append(starting(way))
    imported = statistics.median(figures["import"])
    goal = 1.3 * imported + 1.5
    forked, spawned = statistics.median(figures["forkserver"]), statistics.median(figures["spawn"])
    print(f"one import of torch and zerotrain.runtime: {spread(figures['import'])}")
    print(f"starting, ranks forked from the preloaded server: {spread(figures['forkserver'])}")
    print(f"starting, ranks spawned as fresh interpreters:     {spread(figures['spawn'])}")
    print(f"forked / spawned: {forked / spawned:.2f}; goal 1.3 × import + 1.5 s = {goal:.2f} s: forked is "
          f"{forked / goal:.2f} × the goal")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "goal": goal}, indent=2))


if __name__ == "__main__":
    main()
