"""Sizes and counts as people and Kubernetes write them."""

from __future__ import annotations

import pytest

from zerotrain.quantity import parse_bytes, parse_count


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80Gi", 80 * 2**30),
        ("80G", 80 * 10**9),
        ("80GB", 80 * 10**9),
        ("80GiB", 80 * 2**30),
        ("1.5M", 1_500_000),
        ("8e10", 8 * 10**10),
        ("500m", 0),
        ("512", 512),
        ("lots", None),
        ("80 parsecs", None),
    ],
)
def test_parse_bytes(text: str, expected: int | None) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7.5e9", 7_500_000_000),
        ("7.5B", 7_500_000_000),
        ("1.3b", 1_300_000_000),
        ("64", 64),
        ("125M", 125_000_000),
        ("-5", -5),
        ("x", None),
    ],
)
def test_parse_count(text: str, expected: int | None) -> None:
    assert parse_count(text) == expected
