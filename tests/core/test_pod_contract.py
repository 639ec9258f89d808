"""One pod contract: every ZEROTRAIN_* variable is declared in zerotrain/pod_contract.py and nowhere else, and what
the operator sets in a pod is what the runtime reads."""

from __future__ import annotations

import re
from pathlib import Path

from zerotrain import pod_contract
from zerotrain.operator.children import builders

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("zerotrain", "operator", "runtime") for p in (ROOT / d).rglob("*.py")]


def test_every_variable_is_spelt_out_only_in_the_contract() -> None:
    literal = re.compile(r"""["'](ZEROTRAIN_[A-Z0-9_]+)["']""")
    elsewhere = {
        f"{p.relative_to(ROOT)}: {name}"
        for p in SOURCES
        if p.name != "pod_contract.py"
        for name in literal.findall(p.read_text())
    }
    assert not elsewhere, "declare these in zerotrain/pod_contract.py and import them: " + ", ".join(sorted(elsewhere))


def test_the_contract_declares_each_variable_once() -> None:
    names = [v for k, v in vars(pod_contract).items() if k.endswith("_ENV") and isinstance(v, str)]
    assert len(names) == len(set(names)) and len(names) >= 15


def test_what_the_operator_fixes_in_a_pod_is_in_the_contract() -> None:
    declared = {v for k, v in vars(pod_contract).items() if k.endswith("_ENV") and isinstance(v, str)}
    declared |= set(pod_contract.RENDEZVOUS_ENV)
    assert declared >= builders.FIXED_ENV, builders.FIXED_ENV - declared
