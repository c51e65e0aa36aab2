"""The history table mirrors ``pgqueue_jobs`` column for column, so the move copies every field."""

from __future__ import annotations

from pgqueue.models import JOB_COLUMN_NAMES, Job, JobHistory


def test_history_has_every_job_column_with_the_same_type() -> None:
    jobs, history = Job.__table__.columns, JobHistory.__table__.columns
    assert {c.name for c in history} == set(JOB_COLUMN_NAMES)
    for name in JOB_COLUMN_NAMES:
        assert type(history[name].type) is type(jobs[name].type), name
        if name != "finished_at":  # the partition key: never null in history
            assert history[name].nullable == jobs[name].nullable, name


def test_history_is_partitioned_by_finished_at() -> None:
    table = JobHistory.__table__
    assert table.dialect_options["postgresql"]["partition_by"] == "RANGE (finished_at)"
    assert [c.name for c in table.primary_key] == ["id", "finished_at"]
