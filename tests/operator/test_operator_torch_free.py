"""The operator process must never import torch (it runs in a small image without it)."""

from __future__ import annotations

import subprocess
import sys

from budget import budget


def test_operator_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import zerotrain.operator.app, zerotrain.operator.handlers, zerotrain.commands.operator\n"
        "import zerotrain.cli\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "print('ok')\n"
    )
    assert_runs_fresh(code)


def test_the_spec_and_the_operator_run_no_runtime_code() -> None:
    """The core (spec, planner, CRD) and the operator never import zerotrain.runtime: its package runs code at
    import (a process-wide warnings filter) that a spec reader must not get."""
    code = (
        "import sys\n"
        "import zerotrain.spec, zerotrain.plan, zerotrain.plan.peak, zerotrain.crd\n"
        "import zerotrain.operator.app, zerotrain.operator.controller.admission, zerotrain.operator.handlers\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('zerotrain.runtime'))\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    assert_runs_fresh(code)


def assert_runs_fresh(code: str) -> None:
    """`code` exits 0 printing ok in a new interpreter (nothing already imported by the test run)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=budget(120))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
