"""The job search's reads (``sql.search``): one job by id under the filters, and the bounded walk
of a window, over every table of the executor's ``tables`` (the partitioned history's moved
jobs too), merged into one page. Never commits.

Each table's walk reads at most ``scan`` rows of the window. Where a walk stopped at that
bound, the page ends there: matches beyond that point in the other table are left for the
next page, so ``older`` always means "everything before this point was searched".
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from pgqueue.admin_values import JobPage, ListArguments
from pgqueue.data.admin import moved_job
from pgqueue.data.bulk import like_pattern
from pgqueue.db import Executor
from pgqueue.errors import ValidationError
from pgqueue.job_search import SearchExtent
from pgqueue.models import Job
from pgqueue.sql import search


def shape_of(listing: ListArguments, *, history: bool) -> search.Shape:
    """The statement shape of ``listing`` for one table."""
    match = listing.json_match
    cursor = (
        "before" if listing.before is not None else "after" if listing.after is not None else None
    )
    return search.Shape(
        history=history,
        time_column=listing.time_column,
        since=listing.since is not None,
        until=listing.until is not None,
        cursor=cursor,
        by_queue=listing.queue is not None,
        by_state=listing.state is not None,
        by_task=listing.task_name is not None,
        by_error=listing.error_contains is not None,
        json_column=None if match is None else match.column,
        json_keys=match is not None and bool(match.keys),
        json_contains=match is not None and match.contains,
    )


def parameters(listing: ListArguments) -> dict[str, Any]:
    """The binds of ``listing``'s filters (those the shape names)."""
    params: dict[str, Any] = {
        "since": listing.since,
        "until": listing.until,
        "match_queue": listing.queue,
        "match_state": None if listing.state is None else listing.state.value,
        "match_task": listing.task_name,
    }
    if listing.error_contains is not None:
        params["error_pattern"] = like_pattern(listing.error_contains)
    if listing.json_match is not None:
        params["json_path"] = list(listing.json_match.keys)
        params["json_value"] = listing.json_match.encoded
    return params


def first_id_created(db: Executor, moment: dt.datetime, *, history: bool = False) -> int:
    """The smallest id of the jobs created at or after ``moment`` (one past the largest when
    none was), by bisection (``sql.search.first_id_created``); of the moved jobs with
    ``history``."""
    return int(db.rows(search.first_id_created(history), {"moment": moment})[0][0])


def search_page(session: Session, ex: Executor, listing: ListArguments) -> JobPage:
    """``list_jobs`` for a search (``listing.searching`` or ``listing.job_id``), over every
    table of ``ex.tables`` (``ex``: the executor of ``session``); jobs detached."""
    if listing.job_id is not None:
        return _one_job(session, ex, listing)
    walks = [_walk(session, ex, listing, history) for history in ex.tables.reads]
    session.expunge_all()
    return _merged(listing, walks)


def _one_job(session: Session, ex: Executor, listing: ListArguments) -> JobPage:
    params = {**parameters(listing), "job_id": listing.job_id}
    for history in ex.tables.reads:
        found = session.scalars(search.job_by_id(shape_of(listing, history=history)), params)
        job = found.first()
        if job is not None:
            if history:
                job = moved_job(job)
            session.expunge_all()
            return JobPage((job,), None, None)
    return JobPage((), None, None)


@dataclass(frozen=True, slots=True)
class _Walk:
    """What one table's walk found: its matches in walk order, keyed by their position, the
    rows it read, and where it stopped when it read its bound."""

    matches: list[tuple[tuple[Any, ...], Job]]
    scanned: int
    stop: tuple[Any, ...] | None
    stop_at: dt.datetime | None


def _walk(session: Session, ex: Executor, listing: ListArguments, history: bool) -> _Walk:
    shape = shape_of(listing, history=history)
    params = parameters(listing)
    params.update(scan=listing.scan, limit=listing.limit + 1)
    cursor = listing.before if listing.before is not None else listing.after
    if listing.time_column == "created_at":
        # The window as an id range of this table.
        if listing.since is not None:
            params["low_id"] = first_id_created(ex, listing.since, history=history)
        if listing.until is not None:
            params["high_id"] = first_id_created(ex, listing.until, history=history)
    elif cursor is not None:
        params["cursor_at"] = _cursor_time(ex, cursor)
    params["cursor_id"] = cursor
    rows = session.execute(search.walk(shape), params).all()
    scanned = int(rows[0][0])
    finished = listing.time_column == "finished_at"
    matches = []
    for row in rows:
        job = row[3]
        if job is None:
            continue
        if history:
            job = moved_job(job)
        key = (job.finished_at, job.id) if finished else (job.id,)
        matches.append((key, job))
    cut = scanned >= listing.scan and rows[0][1] is not None
    stop = None
    if cut:
        stop = (rows[0][2], rows[0][1]) if finished else (rows[0][1],)
    return _Walk(matches, scanned, stop, rows[0][2] if cut else None)


def _cursor_time(ex: Executor, job_id: int) -> dt.datetime:
    """When job ``job_id`` (a cursor of a ``finished_at`` search) finished."""
    for history in ex.tables.reads:
        rows = ex.rows(search.finished_at_of(history), {"job_id": job_id})
        if rows and rows[0][0] is not None:
            return rows[0][0]  # type: ignore[no-any-return]
    raise ValidationError(
        f"job {job_id} (the cursor) is no longer a finished job: search again from the start"
    )


def _merged(listing: ListArguments, walks: list[_Walk]) -> JobPage:
    """One page out of each table's walk, in the walk's order, ending where a walk stopped."""
    ascending = listing.after is not None
    stops = [w.stop for w in walks if w.stop is not None]
    # The first point, in walk order, at which some table was no longer read.
    stop = (max(stops) if not ascending else min(stops)) if stops else None
    seen: dict[int, tuple[tuple[Any, ...], Job]] = {}
    for walk in walks:
        for key, job in walk.matches:
            beyond = stop is not None and (key > stop if ascending else key < stop)
            if not beyond:
                seen.setdefault(job.id, (key, job))  # the live table's row first
    ordered = sorted(seen.values(), key=lambda item: item[0], reverse=not ascending)
    page = [job for _, job in ordered[: listing.limit]]
    more = len(ordered) > listing.limit
    go_on = page[-1].id if more else None
    if go_on is None and stop is not None:
        go_on = int(stop[-1])
    stop_at = next((w.stop_at for w in walks if w.stop == stop), None) if stop else None
    extent = SearchExtent(sum(w.scanned for w in walks), stop is not None, stop_at)
    if ascending:
        page.reverse()
        older = page[-1].id if page else None
        return JobPage(tuple(page), go_on, older, extent)
    newer = page[0].id if listing.before is not None and page else None
    return JobPage(tuple(page), newer, go_on, extent)
