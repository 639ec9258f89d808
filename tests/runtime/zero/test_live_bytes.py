"""The live-bytes meter the plan is checked and activations are measured with: each storage once, in-place resizes
followed, held storages (and their views) never counted."""

from __future__ import annotations

import torch

from zerotrain.runtime.zero.live_bytes import LiveBytes


def test_the_meter_counts_each_storage_once_and_follows_in_place_resizes() -> None:
    live = LiveBytes()
    with live:
        a = torch.zeros(1000)  # 4,000 bytes
        view = a[10:20]  # the same storage: not counted again
        with live.phase("grow"):
            b = torch.ones(500)
            del b  # freed: the peak remembers it
        a.untyped_storage().resize_(0)  # how stage 3 frees a gathered buffer
        after_free = live.live
        a.untyped_storage().resize_(8000)
    assert view.numel() == 10 and after_free == 0
    assert live.phase_peaks["grow"] == 6000 and live.peak == 8000 and live.live == 8000


def test_held_storages_and_their_views_are_not_counted() -> None:
    weight = torch.zeros(100, 10)
    live = LiveBytes(held=[weight])
    with live:
        transposed = weight.t()  # a view: the weight's own storage
        product = torch.ones(3, 100) @ weight  # 3 x 10 fp32: new
    assert transposed.shape == (10, 100) and product.shape == (3, 10)
    assert live.peak == 3 * 100 * 4 + 3 * 10 * 4 and live.live == 3 * 10 * 4  # the ones are gone with the expression
