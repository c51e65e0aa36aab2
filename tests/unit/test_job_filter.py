"""The bulk actions' filter, without a database: which states each action applies to, the refusal
of an empty or unfitting filter, times as the CLI and the dashboard read them, the audit record's
form of a filter, and the error text pattern whose ``%`` and ``_`` are plain characters."""

from __future__ import annotations

import datetime as dt

import pytest

from pgqueue.data.bulk import like_pattern
from pgqueue.errors import ValidationError
from pgqueue.job_filter import BulkAction, JobFilter, parse_time
from pgqueue.states import JobState

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def test_each_action_applies_to_the_states_of_its_single_job_counterpart() -> None:
    chosen = JobFilter(queue="q")
    assert chosen.states_for(BulkAction.RETRY) == {JobState.FAILED, JobState.CANCELLED}
    assert chosen.states_for(BulkAction.CANCEL) == {
        JobState.QUEUED,
        JobState.RETRYING,
        JobState.WAITING,
        JobState.RUNNING,
    }
    assert chosen.states_for(BulkAction.DELETE) == set(JobState) - {JobState.RUNNING}
    failed = JobFilter(states=frozenset({JobState.FAILED}))
    assert failed.states_for(BulkAction.RETRY) == {JobState.FAILED}
    with pytest.raises(ValidationError, match=r"cannot cancel jobs in state failed \(cancel"):
        failed.states_for(BulkAction.CANCEL)


def test_an_empty_filter_is_refused_unless_it_says_all_jobs() -> None:
    with pytest.raises(ValidationError, match="refusing to delete every job"):
        JobFilter().states_for(BulkAction.DELETE)
    assert JobFilter(all_jobs=True).states_for(BulkAction.RETRY) == {
        JobState.FAILED,
        JobState.CANCELLED,
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"queue": "bad queue"}, "queue name 'bad queue' has characters"),
        ({"task_name": ""}, "task name '' has characters"),
        ({"states": frozenset({"lost"})}, "unknown state 'lost'"),
        ({"since": dt.datetime(2026, 1, 1)}, "since must be a timezone-aware datetime"),
        ({"since": NOW, "until": NOW}, "must be before until"),
        ({"time_column": "run_at"}, "time_column must be one of created_at, finished_at"),
        ({"error_contains": ""}, "error_contains must be 1 to 1000 characters"),
        ({"error_contains": "a\x00b"}, "error_contains must be 1 to 1000 characters"),
    ],
)
def test_bad_filter_values_are_refused_with_the_field_named(
    arguments: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        JobFilter(**arguments)  # type: ignore[arg-type]


def test_times_are_iso_8601_in_utc_unless_an_offset_is_given_or_an_age() -> None:
    assert parse_time("since", "2026-11-21T22:00", NOW) == dt.datetime(
        2026, 11, 21, 22, 0, tzinfo=dt.UTC
    )
    with_offset = parse_time("since", "2026-11-21T22:00+01:00", NOW)
    assert with_offset == dt.datetime(2026, 11, 21, 21, 0, tzinfo=dt.UTC)
    assert parse_time("since", "12h", NOW) == NOW - dt.timedelta(hours=12)
    assert parse_time("until", "90m", NOW) == NOW - dt.timedelta(minutes=90)
    assert parse_time("until", "2d", NOW) == NOW - dt.timedelta(days=2)
    with pytest.raises(ValidationError, match="--since 'last night' is not a time"):
        parse_time("--since", "last night", NOW)


def test_the_audit_record_holds_the_given_fields_only() -> None:
    chosen = JobFilter(
        queue="mail",
        states=frozenset({JobState.FAILED, JobState.CANCELLED}),
        since=NOW,
        error_contains="50%",
    )
    assert chosen.as_record() == {
        "queue": "mail",
        "states": ["cancelled", "failed"],
        "time_column": "created_at",
        "since": "2026-11-22T12:00:00+00:00",
        "error_contains": "50%",
    }
    assert JobFilter(all_jobs=True).as_record() == {"all_jobs": True}


def test_error_text_wildcards_and_escapes_are_plain_characters() -> None:
    assert like_pattern("100% full") == "%100\\% full%"
    assert like_pattern("rate_limit") == "%rate\\_limit%"
    assert like_pattern("C:\\temp") == "%C:\\\\temp%"
