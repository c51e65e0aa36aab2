"""The admin API's pure parts: checking a listing's arguments and cutting a page with its
cursors from the rows read. No database."""

from __future__ import annotations

import pytest

from pgqueue.admin import MAX_JOB_ID, MAX_PAGE_SIZE, check_job_id, list_arguments, page_of
from pgqueue.errors import ValidationError
from pgqueue.models import Job
from pgqueue.states import JobState


def _jobs(*ids: int) -> list[Job]:
    return [Job(id=job_id) for job_id in ids]


def _ids(jobs: tuple[Job, ...]) -> list[int]:
    return [job.id for job in jobs]


def _arguments(**given: object) -> object:
    base: dict[str, object] = {
        "queue": None,
        "state": None,
        "task_name": None,
        "before": None,
        "after": None,
        "limit": 50,
    }
    base.update(given)
    return list_arguments(**base)  # type: ignore[arg-type]


def test_first_page_with_more_rows_has_an_older_page_only() -> None:
    page = page_of(_jobs(10, 9, 8, 7), limit=3, before=None, after=None)
    assert _ids(page.jobs) == [10, 9, 8]
    assert (page.newer, page.older) == (None, 8)


def test_last_page_walking_older_has_a_newer_page_only() -> None:
    page = page_of(_jobs(4, 3), limit=3, before=5, after=None)
    assert _ids(page.jobs) == [4, 3]
    assert (page.newer, page.older) == (4, None)


def test_page_walking_newer_keeps_the_rows_next_to_the_cursor() -> None:
    # Rows come newest first; walking newer from 3, the page is the three just above it.
    page = page_of(_jobs(7, 6, 5, 4), limit=3, before=None, after=3)
    assert _ids(page.jobs) == [6, 5, 4]
    assert (page.newer, page.older) == (6, 4)


def test_newest_page_reached_walking_newer_has_no_newer_page() -> None:
    page = page_of(_jobs(5, 4), limit=3, before=None, after=3)
    assert _ids(page.jobs) == [5, 4]
    assert (page.newer, page.older) == (None, 4)


def test_an_empty_page_has_no_cursors() -> None:
    for before, after in ((None, None), (5, None), (None, 5)):
        page = page_of([], limit=3, before=before, after=after)
        assert (page.jobs, page.newer, page.older) == ((), None, None)


def test_listing_arguments_are_checked_and_states_parsed() -> None:
    checked = _arguments(queue="mail", state="failed", task_name="send", before=7, limit=2)
    assert checked == list_arguments(
        queue="mail", state=JobState.FAILED, task_name="send", before=7, after=None, limit=2
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"queue": "a\x00b"}, "queue must be a str without NUL"),
        ({"task_name": 3}, "task_name must be a str"),
        ({"state": "sleeping"}, "unknown state 'sleeping'"),
        ({"before": -1}, "before must be a job id"),
        ({"after": MAX_JOB_ID + 1}, "after must be a job id"),
        ({"before": True}, "before must be a job id"),
        ({"before": 2, "after": 1}, "not both"),
        ({"limit": 0}, "limit must be an int from 1"),
        ({"limit": MAX_PAGE_SIZE + 1}, "limit must be an int from 1"),
        ({"limit": "5"}, "limit must be an int from 1"),
    ],
)
def test_bad_listing_arguments_are_refused(given: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _arguments(**given)


def test_the_edges_of_the_ranges_are_accepted() -> None:
    assert _arguments(before=0, limit=1) is not None
    assert _arguments(after=MAX_JOB_ID, limit=MAX_PAGE_SIZE) is not None


@pytest.mark.parametrize("value", [0, -3, True, "7", 1.0, None])
def test_a_job_id_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(ValidationError, match="job id must be a positive int"):
        check_job_id(value)


def test_a_positive_job_id_is_returned() -> None:
    assert check_job_id(12) == 12
