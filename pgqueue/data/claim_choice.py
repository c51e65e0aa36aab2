"""Which variant of the claim statement a claimer runs (``sql.claim.ClaimVariant``); pure.

The lean variant skips limited queues, rate-limited queues and keyed tickets, so a claimer must
know whether any queue has a concurrency limit and whether any flow control (concurrency key,
key override, rate limit) exists. It looks now and then (``data.claim.LIMITS_CHECK_SECONDS``),
and at once when a notified claim came back empty, and keeps the answers in its
``LimitsSeen``: the worker's store owns one; a claim through a session uses the one of the
session's engine or connection.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from pgqueue.sql.claim import ClaimVariant


class LimitsSeen:
    """A claimer's last look at which controls exist (they choose the claim variant), and
    when its last short claim's rate windows free. Until the claimer has looked, queue limits
    are assumed (the full variant is always correct) and flow controls are not: the first claim
    is followed by the first look, and a short first claim by a claim of the flow variant when
    that look finds flow controls."""

    def __init__(self) -> None:
        self.exist = True
        self.flow = False
        self.rates = False
        self.until = 0.0  # monotonic time after which the answer is stale
        self.rate_wait: float | None = None
        """Seconds from the last claim until a full rate window has room (None: none full)."""

    def stale(self, now: float) -> bool:
        return now >= self.until

    def record(self, exist: bool, *, until: float, flow: bool = False, rates: bool = False) -> None:
        """What the claimer saw: queue limits (``exist``), flow controls and rate limits."""
        self.exist = exist
        self.flow = flow
        self.rates = rates
        self.until = until


# Per claimer: the engine or connection behind a claiming session, or the executor the worker
# claims on. Weak keys: an entry goes with its claimer, and never passes to a new object that
# happens to get the same ``id``.
_limits_seen: weakref.WeakKeyDictionary[Any, LimitsSeen] = weakref.WeakKeyDictionary()


def limits_seen_by(claimer: Any) -> LimitsSeen:
    """The ``LimitsSeen`` of ``claimer`` (a session's bind, or an executor), made on first use."""
    seen = _limits_seen.get(claimer)
    if seen is None:
        seen = _limits_seen[claimer] = LimitsSeen()
    return seen


def claim_variant(
    *,
    atomic: bool,
    queues: Sequence[str] | None,
    limits_exist: bool,
    task_leases: bool,
    flow_exists: bool = False,
    excluding: bool = False,
    atomic_controlled: bool = False,
) -> ClaimVariant:
    """The claim variant for a claim of ``queues`` (None: all) in this mode (``excluding``:
    some task names are to be passed over; ``atomic_controlled``: atomic jobs of controlled
    work, in a statement of its own)."""
    return ClaimVariant(
        atomic_controlled=atomic_controlled,
        in_transaction=atomic and not atomic_controlled,
        some_queues=queues is not None,
        queue_limits=limits_exist or flow_exists,
        task_leases=task_leases,
        flow=flow_exists,
        excluded=excluding,
    )
