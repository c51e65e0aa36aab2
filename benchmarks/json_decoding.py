"""What decoding a claimed job's JSON costs: ``codec.load_json`` against the stdlib
decoder it reads like, per value, on typical arguments.

``python -m benchmarks.json_decoding [--rounds 15] [--seconds 0.1]`` (no database) times both
on each payload in alternating rounds (so a change in the machine's load hits both alike),
from ``str`` (the worker reads ``args``/``kwargs`` as text) and from ``bytes`` (the driver's
``json`` loader), and prints the median microseconds per value, the median of the rounds'
ratios and the load average. Pin it to one core for steadier numbers (``taskset -c 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from pgqueue import codec

_STDLIB = json.JSONDecoder().decode


def stdlib_load(data: bytes | str) -> Any:
    """The stdlib decoder behind ``load_json``'s fast paths for ``[]`` and ``{}``."""
    if data == b"[]" or data == "[]":
        return []
    if data == b"{}" or data == "{}":
        return {}
    return _STDLIB(data.decode() if isinstance(data, bytes) else data)


def _compact(value: Any) -> str:
    # As pgqueue stores arguments: compact, non-ASCII kept.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


PAYLOADS: dict[str, str] = {
    "[]": "[]",
    '{"n":1}': _compact({"n": 1}),
    "10-key dict": _compact(
        {f"field_{i}": i * 7919 if i % 2 else f"value number {i}" for i in range(10)}
    ),
    "1 KB payload": _compact(
        {
            "order_id": 912_345_678,
            "customer": {"name": "Zoë Åström", "email": "zoe@example.com", "vip": True},
            "lines": [
                {"sku": f"SKU-{i:05d}", "qty": i + 1, "price": 9.99 + i, "tags": ["a", "bc"]}
                for i in range(13)
            ],
            "note": "leave at the door, ring twice " * 3,
            "coupon": None,
        }
    ),
}


def _per_value_us(load: Callable[[Any], Any], data: bytes | str, seconds: float) -> float:
    """Microseconds per call, over batches run for about ``seconds``."""
    batch = 1000
    calls = 0
    start = time.perf_counter()
    while True:
        for _ in range(batch):
            load(data)
        calls += batch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.1, help="per measurement")
    options = parser.parse_args()
    loaders = {"stdlib": stdlib_load, "load_json": codec.load_json}
    rows = []
    for name, text in PAYLOADS.items():
        for kind, data in (("str", text), ("bytes", text.encode())):
            assert stdlib_load(data) == codec.load_json(data)
            times: dict[str, list[float]] = {label: [] for label in loaders}
            for round_ in range(options.rounds):
                order = list(loaders) if round_ % 2 == 0 else list(reversed(loaders))
                for label in order:
                    times[label].append(_per_value_us(loaders[label], data, options.seconds))
            before = statistics.median(times["stdlib"])
            after = statistics.median(times["load_json"])
            ratio = statistics.median(
                a / b for a, b in zip(times["load_json"], times["stdlib"], strict=True)
            )
            rows.append((name, len(data), kind, before, after, ratio))
    print("| payload | bytes | input | stdlib (us) | load_json (us) | load_json / stdlib |")
    print("|---|---:|---|---:|---:|---:|")
    for name, size, kind, before, after, ratio in rows:
        print(f"| {name} | {size} | {kind} | {before:.3f} | {after:.3f} | {ratio:.2f} |")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
