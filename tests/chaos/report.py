"""The chaos run's report: what ran, what was injected, what was checked, and a trace per
violation (the job's row, its ledger rows, and the faults around them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .invariants import Violation
from .snapshot import Snapshot, clock
from .workload import Event

TRACE_MARGIN = 8.0  # seconds of faults shown before and after a job's runs
MAX_TRACES = 12
MAX_ROWS = 10  # ledger rows shown per job


def table(title: str, counts: dict[str, Counter[str]], columns: list[str]) -> list[str]:
    width = max([len(title), *(len(k) for k in counts)]) + 2
    lines = [title.ljust(width) + "".join(c[:10].rjust(11) for c in columns)]
    for name in sorted(counts):
        row = counts[name]
        lines.append(name.ljust(width) + "".join(str(row.get(c, 0)).rjust(11) for c in columns))
    return lines


def summary(
    seed: int,
    snapshot: Snapshot,
    events: Iterable[Event],
    checks: Counter[str],
    passed: int,
    violations: list[Violation],
    notes: list[str],
) -> str:
    """The report printed at the end of a run; its last line is ``N passed, M failed``."""
    by_kind: dict[str, Counter[str]] = {}
    for job in snapshot.jobs.values():
        by_kind.setdefault(job.kind or "?", Counter())[job.state] += 1
    runs: Counter[str] = Counter()
    for job_runs in snapshot.runs.values():
        for run in job_runs:
            runs[run.kind] += 1
    for kind, count in runs.items():
        by_kind.setdefault(kind, Counter())["runs"] = count
    states = ["succeeded", "failed", "cancelled", "queued", "retrying", "waiting", "running"]
    lines = [f"chaos report, seed {seed}", ""]
    lines += table("jobs by kind", by_kind, [*states, "runs"])
    total = Counter[str]()
    for counts in by_kind.values():
        total.update(counts)
    lines.append(
        f"total: {len(snapshot.jobs)} jobs, {total['runs']} handler runs, "
        + ", ".join(f"{s} {total[s]}" for s in states if total[s])
    )
    injected = Counter(e.kind for e in events)
    lines += [
        "",
        "faults and admin moves: " + ", ".join(f"{k} {v}" for k, v in sorted(injected.items())),
    ]
    lines += [*notes]
    failed = Counter(v.invariant for v in violations)
    lines += ["", "invariant".ljust(30) + "checks".rjust(8) + "violations".rjust(12)]
    for name in sorted(checks):
        lines.append(name.ljust(30) + str(checks[name]).rjust(8) + str(failed[name]).rjust(12))
    lines.append("")
    lines.append(f"{passed} passed, {len(violations)} failed")
    return "\n".join(lines)


def _seen(violation: Violation) -> str:
    """When the checks saw ``violation``: its message is worded as the latest check saw it, so
    a number in it (an age, a count) belongs to that check, not to the first."""
    first, last = violation.first_seen, violation.last_seen
    if first is None:
        return ""
    if last is None or last == first:
        return f" (seen {clock(first)})"
    return f" (first seen {clock(first)}; worded as last seen, {clock(last)})"


def traces(seed: int, snapshot: Snapshot, events: list[Event], violations: list[Violation]) -> str:
    """A short trace per violation (the first ``MAX_TRACES``), with the seed to replay it."""
    lines = [f"VIOLATIONS (seed {seed}, replay: python -m tests.chaos --seed {seed} ...)"]
    for violation in violations[:MAX_TRACES]:
        lines.append("")
        seen = _seen(violation)
        lines.append(f"[{violation.invariant}] job {violation.job_id}: {violation.message}{seen}")
        job = snapshot.jobs.get(violation.job_id) if violation.job_id is not None else None
        job_ids = {violation.job_id} if violation.job_id is not None else set()
        for run_id in violation.run_ids:
            for runs in (*snapshot.runs.values(), *snapshot.txs.values()):
                job_ids.update(r.job_id for r in runs if r.id == run_id)
        times: list[float] = []
        for job_id in sorted(i for i in job_ids if i is not None):
            job = snapshot.jobs.get(job_id)
            rows = [
                *snapshot.runs.get(job_id, []),
                *snapshot.txs.get(job_id, []),
                *snapshot.sessions.get(job_id, []),
            ]
            if job is None:
                if not rows:
                    continue
                # Deleted or pruned once it ended: its ledger rows and faults still tell.
                lines.append(f"  job {job_id} (gone from the tables: deleted or pruned)")
            else:
                errors = [
                    f"{e.get('attempt')}: {str(e.get('error'))[:90]!r}" for e in job.errors or []
                ]
                lines.append(
                    f"  job {job.id} {job.task_name} kind={job.kind} queue={job.queue} "
                    f"state={job.state} attempts={job.attempts}/{job.max_attempts} "
                    f"snoozes={job.snoozes} key={job.concurrency_key} unique={job.unique_key} "
                    f"depends_on={job.depends_on} created={clock(job.created_at.timestamp())} "
                    f"finished={clock(job.finished_at.timestamp() if job.finished_at else None)}"
                )
                lines.extend(f"    error {e}" for e in errors[-6:])
            for run in rows:
                times += [run.started, run.ended or run.started]
            # The first and the last rows: a job run thousands of times needs no more.
            shown = rows if len(rows) <= MAX_ROWS else [*rows[: MAX_ROWS - 3], *rows[-3:]]
            for index, run in enumerate(shown):
                if len(rows) > MAX_ROWS and index == MAX_ROWS - 3:
                    lines.append(f"    ... {len(rows) - MAX_ROWS} more ledger rows")
                worker = f" worker={run.holder}" if run.in_child else ""
                alive = f" alive={clock(run.alive_at)}" if run.alive_at else ""
                lines.append(
                    f"    ledger {run.id} {run.tag} attempt={run.attempt} pid={run.pid}{worker} "
                    f"{clock(run.started)} -> {clock(run.ended)}{alive} outcome={run.outcome}"
                )
            if job is not None:
                times.append(job.created_at.timestamp())
        if times:
            lo, hi = min(times) - TRACE_MARGIN, max(times) + TRACE_MARGIN
            near = [e for e in events if lo <= e.at <= hi and e.kind != "cancel"]
            for event in near[:15]:
                until = f" until {clock(event.until)}" if event.until else ""
                lines.append(f"    fault {clock(event.at)} {event.kind}: {event.detail}{until}")
    if len(violations) > MAX_TRACES:
        lines.append(f"... and {len(violations) - MAX_TRACES} more")
    return "\n".join(lines)
