"""The operator process must never import torch (it runs in a small image without it)."""

from __future__ import annotations

import subprocess
import sys


def test_operator_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import zerotrain.operator.app, zerotrain.operator.handlers, zerotrain.commands.operator\n"
        "import zerotrain.status_report, zerotrain.cli\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
