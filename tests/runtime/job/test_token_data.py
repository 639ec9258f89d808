"""Token files: memory-mapped flat binaries, batches identical at every world size, and one-line refusals."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from zerotrain.elastic import Layout
from zerotrain.runtime.job.elastic_batches import SlotBatches
from zerotrain.runtime.job.task import ConfigError
from zerotrain.runtime.job.token_data import EvalTokenBatches, TokenBatches, TokenFiles


def write_tokens(path: Path, ids: np.ndarray, dtype: str = "<u2") -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(np.asarray(ids, dtype=dtype).tobytes())
    return np.asarray(ids, dtype=np.int64)


@pytest.fixture
def stream(tmp_path: Path) -> np.ndarray:
    """Two shards (a.bin, b.bin) of distinct ids, so every window's position in the stream is recognisable."""
    ids = np.arange(5000) % 60_000
    write_tokens(tmp_path / "shards" / "a.bin", ids[:3001])
    write_tokens(tmp_path / "shards" / "b.bin", ids[3001:])
    return ids


def shards(tmp_path: Path) -> TokenFiles:
    return TokenFiles(str(tmp_path / "shards" / "*.bin"))


def test_files_concatenate_sorted_and_read_across_boundaries(tmp_path: Path, stream: np.ndarray) -> None:
    # Given out of order, twice: the set is sorted and deduplicated.
    files = TokenFiles([str(tmp_path / "shards" / "b.bin"), str(tmp_path / "shards" / "*.bin")])
    assert [p.name for p in files.paths] == ["a.bin", "b.bin"]
    assert len(files) == files.num_tokens == 5000 and files.dtype == "uint16"
    got = files.read(2990, 3010)
    assert got.dtype == torch.int64 and got.tolist() == stream[2990:3010].tolist()
    assert files.locate(3005) == (tmp_path.resolve() / "shards" / "b.bin", 4)
    with pytest.raises(IndexError):
        files.read(4990, 5001)


def test_relative_patterns_resolve_against_the_working_directory(
    tmp_path: Path, stream: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert len(TokenFiles("shards/a.bin")) == 3001
    assert f"got 'missing/*.bin', which matches no file (searched {tmp_path / 'missing'})" in refusal(
        TokenFiles, "missing/*.bin"
    )


def test_uint32_files_and_meta_json_dtype(tmp_path: Path) -> None:
    ids = np.array([1, 70_000, 2**31, 5])
    write_tokens(tmp_path / "train.bin", ids, "<u4")
    (tmp_path / "meta.json").write_text(json.dumps({"dtype": "uint32", "vocab_size": 2**32 - 1}))
    files = TokenFiles(str(tmp_path / "train.bin"))
    assert files.dtype == "uint32" and files.meta is not None and files.meta["vocab_size"] == 2**32 - 1
    assert files.read(0, 4).tolist() == ids.tolist()
    assert TokenFiles(str(tmp_path / "train.bin"), dtype="uint32").read(1, 2).tolist() == [70_000]


@pytest.mark.parametrize("accumulation", [1, 2])
def test_global_batch_is_world_size_invariant(tmp_path: Path, stream: np.ndarray, accumulation: int) -> None:
    steps, batch, seq_len = 3, 8, 700  # long windows: several cross the a.bin/b.bin boundary
    files = shards(tmp_path)

    def global_steps(world: int) -> list[torch.Tensor]:
        ranks = [
            TokenBatches(files, seq_len=seq_len, batch_size=batch, rank=r, world_size=world, seed=7)
            for r in range(world)
        ]
        return [torch.cat([torch.cat([next(b) for b in ranks]) for _ in range(accumulation)]) for _ in range(steps)]

    reference = global_steps(1)
    assert reference[0].shape == (batch * accumulation, seq_len + 1) and reference[0].dtype == torch.int64
    for world in (2, 4):
        for got, want in zip(global_steps(world), reference, strict=True):
            assert torch.equal(got, want)
    assert not torch.equal(reference[0], reference[1])
    for row in reference[0]:  # every row is a window of the concatenated stream
        start = int(row[0])
        assert row.tolist() == stream[start : start + seq_len + 1].tolist()
    other_seed = TokenBatches(files, seq_len=seq_len, batch_size=batch, rank=0, world_size=1, seed=8)
    assert not torch.equal(other_seed.global_batch(0), reference[0][:batch])


def test_resume_continues_exactly(tmp_path: Path, stream: np.ndarray) -> None:
    files = shards(tmp_path)
    first = TokenBatches(files, seq_len=32, batch_size=4, rank=1, world_size=2, seed=3)
    for _ in range(3):
        next(first)
    state = first.state_dict()
    assert state == {"micro_batches": 3}
    resumed = TokenBatches(files, seq_len=32, batch_size=4, rank=1, world_size=2, seed=3)
    resumed.load_state_dict(state)
    for _ in range(2):
        assert torch.equal(next(resumed), next(first))


def test_slot_batches_accept_token_batches(tmp_path: Path, stream: np.ndarray) -> None:
    """A gang of 1 running a manifest of 2 ranks: its two slots of step 0 are global micro-batch 0's halves."""
    source = TokenBatches(shards(tmp_path), seq_len=16, batch_size=4, rank=0, world_size=2, seed=1)
    slots = SlotBatches(source, Layout(reference_world=2, reference_accumulation=1, world=1), rank=0)
    assert torch.equal(torch.cat([next(slots), next(slots)]), source.global_batch(0))
    assert torch.equal(next(slots), source.global_batch(1, slice(0, 2)))


def test_eval_batches_are_fixed_consecutive_windows(tmp_path: Path, stream: np.ndarray) -> None:
    files, seq_len, batch = shards(tmp_path), 99, 4  # 5000 tokens: 50 windows of 100, 12 full micro-batches
    single = EvalTokenBatches(files, seq_len=seq_len, batch_size=batch, rank=0, world_size=1)
    assert single.micro_batches == len(single) == 12
    everything = list(single())
    assert len(everything) == 12 and torch.equal(torch.cat(list(single())), torch.cat(everything))
    assert torch.cat(everything).flatten().tolist() == stream[: 12 * batch * 100].tolist()
    halves = [EvalTokenBatches(files, seq_len=seq_len, batch_size=batch, rank=r, world_size=2) for r in (0, 1)]
    for j, (a, b) in enumerate(zip(halves[0](), halves[1](), strict=True)):
        assert torch.equal(torch.cat([a, b]), everything[j])


class SpyMap:
    """Stands in for a memmap and records how many ids each index asks for."""

    def __init__(self, inner: np.memmap) -> None:
        self.inner = inner
        self.asked: list[int] = []

    def __getitem__(self, key: slice) -> np.ndarray:
        got = self.inner[key]
        self.asked.append(len(got))
        return got


def resident_bytes(path: Path) -> int | None:
    """Bytes of `path` mapped into this process's page tables (Rss in /proc/self/smaps); None off Linux."""
    smaps = Path("/proc/self/smaps")
    if not smaps.exists():
        return None
    resident, in_mapping = 0, False
    for line in smaps.read_text().splitlines():
        if "-" in line.split(" ", 1)[0] and line[:1] in "0123456789abcdef":
            in_mapping = line.rstrip().endswith(str(path.resolve()))
        elif in_mapping and line.startswith("Rss:"):
            resident += int(line.split()[1]) * 1024
    return resident


def test_files_are_memory_mapped_and_sampling_reads_only_the_windows(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    size = 32 * 2**20
    big.write_bytes((np.arange(size // 2, dtype=np.uint32) % 50_000).astype("<u2").tobytes())
    files = TokenFiles(str(big))
    assert files.maps and all(isinstance(m, np.memmap) and m.mode == "r" for m in files.maps)
    batches = TokenBatches(files, seq_len=64, batch_size=2, rank=0, world_size=1)
    held = [v for v in [*vars(files).values(), *vars(batches).values()] if isinstance(v, (torch.Tensor, np.ndarray))]
    assert all(isinstance(v, np.memmap) for v in held)  # no copy of the data kept beside the maps
    spy = SpyMap(files.maps[0])
    files.maps[0] = spy
    assert next(batches).shape == (2, 65)
    assert spy.asked == [65, 65]  # each row indexes its own window, nothing more
    files.maps[0] = spy.inner
    next(batches)
    resident = resident_bytes(big)
    if resident is None:
        pytest.skip("no /proc/self/smaps to measure the mapping's resident pages")
    # The windows' pages plus the kernel's fault-around (up to a 2 MiB folio each on ext4), far from all 32 MiB.
    assert resident < size // 2, f"{resident} of {size} bytes of the token file are mapped in"


def test_ids_outside_the_vocabulary_name_the_file_and_offset(tmp_path: Path) -> None:
    write_tokens(tmp_path / "t.bin", np.r_[np.zeros(10, int), 300, np.zeros(10, int)])
    files = TokenFiles(str(tmp_path / "t.bin"))
    batches = TokenBatches(files, seq_len=20, batch_size=2, rank=0, world_size=1, vocab_size=256)
    with pytest.raises(ConfigError) as e:
        batches.global_batch(0)
    message = str(e.value)
    assert "token id 300 at token 10 of" in message and "t.bin" in message and "vocabulary of 256" in message
    assert "tokenizer" in message and "vocab_size" in message and "\n" not in message
    eval_batches = EvalTokenBatches(files, seq_len=9, batch_size=2, rank=1, world_size=2, vocab_size=256)
    with pytest.raises(ConfigError, match=r"token id 300 at token 10 of .*t\.bin"):
        list(eval_batches())
    assert (
        TokenBatches(files, seq_len=20, batch_size=2, rank=0, world_size=1, vocab_size=301).global_batch(0).max() == 300
    )


def refusal(fn: Callable[..., object], *args: object, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args, **kwargs)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_refusals_name_the_field_value_and_fix(tmp_path: Path, stream: np.ndarray) -> None:
    message = refusal(TokenFiles, str(tmp_path / "nothing" / "*.bin"), field="spec.entrypointArgs.val")
    assert message.startswith("spec.entrypointArgs.val: got ") and "matches no file" in message
    assert f"searched {tmp_path / 'nothing'}" in message
    assert "got no paths" in refusal(TokenFiles, [])
    (tmp_path / "empty.bin").write_bytes(b"")
    assert "hold no tokens" in refusal(TokenFiles, str(tmp_path / "empty.bin"))
    assert "dtype got 'int8'; use uint16, uint32 or auto" in refusal(
        TokenFiles, str(tmp_path / "shards/a.bin"), dtype="int8"
    )

    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02\x00\x03\x00")  # 6 bytes: uint16, never uint32
    message = refusal(TokenFiles, str(tmp_path / "odd.bin"), dtype="uint32")
    assert "odd.bin holds 6 bytes, not a whole number of uint32 ids (4 bytes each)" in message
    assert "set dtype uint16" in message and "cut short" in message
    (tmp_path / "cut.bin").write_bytes(b"\x01\x00\x02")
    message = refusal(TokenFiles, str(tmp_path / "cut.bin"))
    assert "cut.bin holds 3 bytes" in message and "uint16" in message and "prepare it again" in message

    write_tokens(tmp_path / "prepared" / "train.bin", np.arange(8))
    (tmp_path / "prepared" / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
    message = refusal(TokenFiles, str(tmp_path / "prepared" / "train.bin"), dtype="uint32")
    assert "dtype got 'uint32', but meta.json beside the files says uint16; use dtype uint16 or auto" in message

    files = shards(tmp_path)
    message = refusal(TokenBatches, files, seq_len=5000, batch_size=2, rank=0, world_size=1)
    assert "seq_len: got 5000" in message and "holds only 5000 tokens" in message and "shorter seq_len" in message
    message = refusal(EvalTokenBatches, files, seq_len=999, batch_size=8, rank=0, world_size=1)
    assert "seq_len: got 999" in message and "8000 needed" in message and "smaller batch_size" in message
    for cls in (TokenBatches, EvalTokenBatches):
        message = refusal(cls, files, seq_len=8, batch_size=6, rank=0, world_size=4)
        assert "spec.entrypointArgs.batch_size: got 6" in message and "4 ranks" in message
    assert "vocab_size: got 0" in refusal(
        TokenBatches, files, seq_len=8, batch_size=2, rank=0, world_size=1, vocab_size=0
    )


def test_a_pattern_matching_only_directories_matches_nothing(tmp_path: Path) -> None:
    os.mkdir(tmp_path / "dir.bin")
    assert "matches no file" in refusal(TokenFiles, str(tmp_path / "*.bin"))
