"""Numbers as people and Kubernetes write them (7.5e9, 7.5B, 80GB, 80Gi, 500m), and bytes written for people."""

from __future__ import annotations

import re

# Kubernetes quantity suffixes, plus the byte spellings people type on the command line.
_BYTES = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "p": 1e15,
    "pb": 1e15,
    "e": 1e18,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
    "pi": 2**50,
    "pib": 2**50,
    "ei": 2**60,
}
# Counts of things (parameters, ranks): SI multipliers, B for billions as model cards write.
_COUNT = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_NUMBER = re.compile(r"\s*(-?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*")


def _parse(text: str, units: dict[str, float], case_sensitive_milli: bool) -> float | None:
    m = _NUMBER.fullmatch(text.lower())
    if not m or m.group(2) not in units:
        return None
    suffix = text.strip()[len(text.strip()) - len(m.group(2)) :] if m.group(2) else ""
    if case_sensitive_milli and suffix == "m":  # Kubernetes: "m" is milli, "M" is mega
        return float(m.group(1)) / 1000
    return float(m.group(1)) * units[m.group(2)]


def parse_bytes(text: str) -> int | None:
    """'80Gi', '80G', '80GB', '8e10' -> bytes; None if it is not a size."""
    value = _parse(text, _BYTES, case_sensitive_milli=True)
    return None if value is None else round(value)


def parse_count(text: str) -> int | None:
    """'7.5e9', '7.5B', '1.3b', '64' -> an integer; None if it is not a number."""
    value = _parse(text, _COUNT, case_sensitive_milli=False)
    return None if value is None else round(value)


def format_bytes(n: float) -> str:
    """Decimal units, as the ZeRO paper counts (GB = 1e9 bytes)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
