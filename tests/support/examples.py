"""How many examples a Hypothesis property runs: its full count in the full run, a tenth of it
(at least 20) in the quick loop, which ``tests/run --quick`` marks by setting
``PGQUEUE_TEST_QUICK=1``. The full run keeps every property's whole proof; the loop keeps every
property, on fewer cases."""

from __future__ import annotations

import os

QUICK_VARIABLE = "PGQUEUE_TEST_QUICK"


def examples(full: int) -> int:
    """``full`` in the full run; ``max(20, full // 10)`` (never more than ``full``) in the
    quick loop."""
    if os.environ.get(QUICK_VARIABLE) == "1":
        return min(full, max(20, full // 10))
    return full
