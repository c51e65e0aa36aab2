"""The chaos harness from pytest: about a minute of faults on fixed seeds, zero violations.

Each run makes its own database on the session's test server (``server_url``) and its own
worker processes. A seed that ever failed goes in ``REGRESSION_SEEDS`` with what it found; while
the bug it found is open it is expected to fail (``xfail``, not strict: a chaos run replays its
seed's choices, not the machine's timing, so it may pass).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from sqlalchemy.engine import URL

from .harness import run

FIXED_SEEDS = [23]
# Seeds run with the partitioned history: jobs moved out of pgqueue_jobs seconds after they end.
HISTORY_SEEDS = [31]
MINUTES = 1.0

# (seed, harness options, the open issue it found, or None once fixed)
REGRESSION_SEEDS: list[tuple[int, dict[str, Any], str | None]] = [
    # A lost atomic attempt whose ticket another session held locked went uncounted.
    (1, {"lock_tickets": True}, None),
    # An atomic transaction lost with its connection was run again by another worker first.
    # Later, under CI's load, an 11 s atomic job ran 12.1 s past its 3 s lease (invariant 6
    # allowed 12) with a SIGSTOP beside it: a stopped process keeps its atomic transaction,
    # and the row the rescue needs, held; the check now adds the seconds stopped.
    (5, {"bouncer": True, "minutes": 3.0}, None),
    # In an hour: three dependents of two parents each left WAITING (the parents ended in
    # concurrent transactions, each settling saw the other still running), and a keyed leased
    # attempt that ran twice in one worker (not seen again since). In two minutes it has also
    # shown four runs of the limited queue at once (limit 3). Two causes, both fixed: setting
    # the queue's limit counted its running jobs from a snapshot older than a claim that
    # committed while the setting waited for the queue's row (the counter forgot that job);
    # and the checker stretched a run without its end mark to its job's next run, past its
    # attempt's outcome.
    (2026, {"bouncer": True, "lock_tickets": True, "minutes": 2.0}, None),
    # Under CI's load (the integration suite on three servers beside it): a slow leased job
    # stayed RUNNING 16 s past its lease's expiry (invariant 6 allows 12), while faults held
    # rows and stopped workers. A rescue pass waited without bound for every row it needed: a
    # fault holding another queue's control row (or a transaction holding the dependents of a
    # job the pass ended) kept every expired job RUNNING (fixed: the pass waits 0.5 s, then
    # rescues queue by queue and job by job). The seed's interleaving itself was not seen
    # again, under load or not, so this cause is the likeliest found, not a proven one.
    (11, {}, None),
]


def _cases() -> list[Any]:
    cases = [pytest.param(seed, {}, id=f"seed{seed}") for seed in FIXED_SEEDS]
    cases += [
        pytest.param(seed, {"history": True}, id=f"seed{seed}-partitioned")
        for seed in HISTORY_SEEDS
    ]
    for seed, options, issue in REGRESSION_SEEDS:
        marks = [pytest.mark.xfail(reason=issue, strict=False)] if issue else []
        cases.append(pytest.param(seed, options, id=f"regression{seed}", marks=marks))
    return cases


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("seed", "options"), _cases())
def test_chaos_finds_no_violation(
    server_url: URL, server_tcp_url: URL, seed: int, options: dict[str, Any]
) -> None:
    options = dict(options)
    minutes = options.pop("minutes", MINUTES)
    # PgBouncer reaches the server over TCP (as root it runs as nobody: no socket access).
    server = server_tcp_url if options.get("bouncer") else server_url
    # The server's directory, when the suite's server may be restarted (tests/run's own
    # Debian server for this tier): the faults then include server restarts.
    server_dir = os.environ.get("PGQUEUE_TEST_SERVER_DIR")
    result = run(
        seed,
        minutes,
        server.render_as_string(hide_password=False),
        server_dir=server_dir,
        **options,
    )
    print(result.text)
    assert not result.violations, result.text
