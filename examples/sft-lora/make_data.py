"""Instruction records for examples/sft-lora: complete a two-argument Python function's return statement.

    python3 examples/sft-lora/make_data.py runs/sft-lora

Every record is one function, `def add(x, y):\\n    return` with the completion ` x + y`: four operations (add, sub,
mul, div) and two distinct argument names out of 30, 3,480 functions in all, shuffled with a fixed seed. One in
twenty goes to test.jsonl and never to train.jsonl: the test asks for argument pairs the model never trained on,
so exact match there is the rule learnt, not the records remembered. Nothing is downloaded.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OPERATIONS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
NAMES = [
    "a", "b", "c", "x", "y", "z", "n", "m", "i", "j", "k", "s", "t", "u", "v", "w", "p", "q", "r",
    "value", "other", "left", "right", "data", "item", "key", "size", "count", "start", "stop",
]  # fmt: skip
TEST_EVERY = 20


def record(op: str, first: str, second: str) -> dict[str, str]:
    return {"prompt": f"def {op}({first}, {second}):\n    return", "completion": f" {first} {OPERATIONS[op]} {second}"}


def main(out: str) -> None:
    functions = [(op, a, b) for op in OPERATIONS for a in NAMES for b in NAMES if a != b]
    random.Random(0).shuffle(functions)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "train.jsonl").open("w") as train, (folder / "test.jsonl").open("w") as test:
        for i, f in enumerate(functions):
            (test if i % TEST_EVERY == 0 else train).write(json.dumps(record(*f)) + "\n")
    tests = len(functions[::TEST_EVERY])
    print(f"wrote {folder}: {len(functions) - tests} training and {tests} test functions")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/sft-lora")
