"""How workflow constructs lay out as jobs (pure: no database): each job's parents, in the order
their results are passed, its role, and the workflow's final jobs."""

from __future__ import annotations

from typing import Any

import pytest

from pgqueue import PgQueue, Settings, ValidationError, chain, chord, group
from pgqueue.states import WorkflowRole

pgq = PgQueue("postgresql+psycopg://nobody@localhost/none", settings=Settings())
other = PgQueue("postgresql+psycopg://nobody@localhost/other", settings=Settings())

M, ONE, MANY, FAIL = (
    WorkflowRole.MEMBER.value,
    WorkflowRole.TAKES_RESULT.value,
    WorkflowRole.TAKES_RESULTS.value,
    WorkflowRole.ON_FAILURE.value,
)


@pgq.task(name="step")
def step(*values: Any) -> None:
    return None


@other.task(name="elsewhere")
def elsewhere() -> None:
    return None


def test_a_chain_passes_one_result_from_step_to_step() -> None:
    _, plan = chain(step.s(1), step.s(), step.si(3))._planned()
    assert list(plan.parents) == [(), (0,), (1,)]
    assert list(plan.roles) == [M, ONE, M]
    assert plan.final == (2,)
    assert [j.args_json for j in plan.jobs] == ["[1]", "[]", "[3]"]


def test_a_chain_through_a_group_fans_out_and_gathers_in_order() -> None:
    _, plan = chain(step.s(), group(step.s(), step.s(), step.s()), step.s())._planned()
    assert list(plan.parents) == [(), (0,), (0,), (0,), (1, 2, 3)]
    assert list(plan.roles) == [M, ONE, ONE, ONE, MANY]
    assert plan.final == (4,)


def test_a_chord_with_on_failure_lays_it_out_last() -> None:
    _, plan = chord([step.s(i) for i in range(3)], step.s(), on_failure=step.s())._planned()
    assert list(plan.parents) == [(), (), (), (0, 1, 2), ()]
    assert list(plan.roles) == [M, M, M, MANY, FAIL]
    assert (plan.final, plan.on_failure) == ((3,), 4)


def test_a_group_of_groups_gives_every_member_as_final() -> None:
    _, plan = group(group(step.s(), step.s()), step.s())._planned()
    assert plan.final == (0, 1, 2)
    assert list(plan.roles) == [M, M, M]


def test_on_failure_inside_a_nested_construct_is_refused() -> None:
    with pytest.raises(ValidationError, match="outermost"):
        chain(step.s(), group(step.s(), on_failure=step.s()))._planned()


def test_tasks_of_two_queues_cannot_share_a_workflow() -> None:
    with pytest.raises(ValidationError, match="one PgQueue"):
        chain(step.s(), elsewhere.si())._planned()


def test_a_group_mixing_signatures_options_and_a_chain_keeps_each_jobs_role_and_options() -> None:
    members = group(
        step.s(1),
        step.s(2).set(queue="fast", priority=4),
        step.si(3),
        step.si(4).set(max_attempts=9),
        chain(step.s(5), step.s()),
        step.s(6),
    )
    _, plan = chain(step.s(0), members, step.s())._planned()
    assert list(plan.parents) == [(), (0,), (0,), (0,), (0,), (0,), (5,), (0,), (1, 2, 3, 4, 6, 7)]
    assert list(plan.roles) == [M, ONE, ONE, M, M, ONE, ONE, ONE, MANY]
    assert [j.args_json for j in plan.jobs] == [
        "[0]", "[1]", "[2]", "[3]", "[4]", "[5]", "[]", "[6]", "[]",
    ]  # fmt: skip
    assert [(j.queue, j.priority) for j in plan.jobs][1:3] == [("default", 0), ("fast", 4)]
    assert [j.max_attempts for j in plan.jobs][3:5] == [plan.jobs[0].max_attempts, 9]


def test_a_group_of_signatures_of_two_queues_is_refused() -> None:
    with pytest.raises(ValidationError, match="one PgQueue"):
        group(step.s(), step.s(), elsewhere.si())._planned()
