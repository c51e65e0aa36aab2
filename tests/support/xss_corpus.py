"""Hostile strings for the dashboard's XSS test, and a database seeded with them through every
channel the dashboard shows: task and queue names, arguments and keyword arguments, results,
error messages and tracebacks, progress messages, step names, signal names and payloads,
unique keys, workflow members, a schedule's name and arguments, and audit actors.

Each markup payload marks what it would create with ``pgq-xss`` (an element of that name or a
``data-pgq-xss`` attribute), so one selector finds any element a payload managed to add, and
its script calls ``alert`` (a dialog the browser test fails on).

What pgqueue's validation lets through goes in through the public API. Task names
(``TASK_NAME_PATTERN``) take letters, digits and ``_.:<>-`` only: ``xss<script>`` passes,
but no quote, space, slash, ``=`` or parenthesis does, so no attribute, end tag or call can be
written. Queue names (``NAME_PATTERN``) take no ``<`` or ``>`` at all; ``javascript:pgq-xss``
passes. Names the validator refuses are written into ``pgqueue_jobs`` by hand, as another
client could.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy import Engine, text

from pgqueue import PgQueue
from pgqueue.context import JobContext
from pgqueue.workflows import chain

PROBE: Final = "pgq-xss"
# Every element or attribute a payload would create, and every way it could run script.
INJECTED: Final = (
    f"{PROBE}, [data-{PROBE}], iframe, object, embed, base, meta[http-equiv=set-cookie],"
    " img[src=x], script:not([src]), [href^='javascript:' i], [src^='javascript:' i],"
    " [action^='javascript:' i], [formaction^='javascript:' i]"
)

PAYLOADS: Final = [
    f'<script data-{PROBE}>alert("script")</script>',
    f'"\'><img src=x data-{PROBE} onerror=alert("img")>',
    f"'\"><svg data-{PROBE} onload=alert(1)><animate onbegin=alert(2) attributeName=x dur=1s>",
    f"<math data-{PROBE}><mtext><table><mglyph><style><img src=x onerror=alert(3)>",
    f"</textarea></title></style></pre></script><{PROBE} onmouseover=alert(4)>x</{PROBE}>",
    f'<a href="javascript:alert(5)" data-{PROBE}>click</a>',
    f'<iframe data-{PROBE} srcdoc="<script>alert(6)</script>"></iframe>',
    "javascript:alert(7)",
    "{{7*7}} ${7*7} <%= 7*7 %> {% raw %}#{7*7}",
    "\u202eevil.exe\u202c \u2066rtl\u2069 \u200fmark",
    "ctl\x01\x07\x08\x0b\x1b[31m\x7fend",
    "A" * 4000 + f"<b data-{PROBE}>long</b>",
]
ERROR_TEXT: Final = "\n".join(PAYLOADS)

# Names pgqueue's validation accepts, with what markup they can carry.
TASK_FAILS: Final = f"xss<script>.{PROBE}"
TASK_SUCCEEDS: Final = f"xss<img>.{PROBE}"
TASK_WAITS: Final = f"xss<{PROBE}>"
QUEUE: Final = f"javascript:{PROBE}"
SIGNAL: Final = PAYLOADS[1]
STEP: Final = PAYLOADS[4]
PROGRESS: Final = PAYLOADS[2]
SCHEDULE: Final = PAYLOADS[0]
ACTOR: Final = PAYLOADS[5]
# Names the validator refuses, as rows another client wrote: (task, queue).
RAW_NAMES: Final = [
    (PAYLOADS[0], PAYLOADS[1]),
    (PAYLOADS[2], PAYLOADS[4]),
    (PAYLOADS[7], PAYLOADS[6]),
]


def _fails(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError(ERROR_TEXT)


def _succeeds(ctx: JobContext, *args: Any, **kwargs: Any) -> dict[str, Any]:
    ctx.progress(0.5, PROGRESS)
    ctx.step(STEP, lambda: PAYLOADS)
    return {"html": PAYLOADS, PAYLOADS[1]: PAYLOADS[0]}


def _waits(ctx: JobContext, *args: Any) -> Any:
    return ctx.wait_for_signal(SIGNAL, timeout=3600)


def register(pgq: PgQueue) -> None:
    """The corpus's tasks (their names carry markup) and a schedule named by a payload."""
    pgq.task(name=TASK_FAILS, queue=QUEUE, max_attempts=1)(_fails)
    succeeds = pgq.task(name=TASK_SUCCEEDS, queue=QUEUE, pass_context=True)(_succeeds)
    pgq.task(name=TASK_WAITS, queue=QUEUE, pass_context=True)(_waits)
    pgq.periodic("0 3 * * *", name=SCHEDULE, args=PAYLOADS[:3], kwargs={"html": PAYLOADS[3]})(
        succeeds
    )


@dataclass
class Seeded:
    """What the corpus wrote: ids to fill the dashboard's routes with, names to filter by."""

    failed: int
    succeeded: int
    waiting: int
    raw: list[int] = field(default_factory=list)
    workflows: list[int] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)

    @property
    def jobs(self) -> list[int]:
        return [self.failed, self.succeeded, self.waiting, *self.raw]


def seed(pgq: PgQueue, engine: Engine) -> Seeded:
    """Write the corpus through ``pgq`` (its tasks registered by :func:`register`) and, for
    the names it refuses, straight into the tables with ``engine``."""
    kwargs = {f"k{i}": p for i, p in enumerate(PAYLOADS)} | {PAYLOADS[1]: PAYLOADS[0]}
    registry = pgq.registry
    failed = registry.get(TASK_FAILS).enqueue(*PAYLOADS, **kwargs)
    succeeded = registry.get(TASK_SUCCEEDS).enqueue(*PAYLOADS, **kwargs)
    waiting = registry.get(TASK_WAITS).enqueue(*PAYLOADS)
    pgq.run_worker(queues=[QUEUE], drain=True)
    # Audited with the payload as the actor: one the signal, one a cancel.
    pgq.admin.signal(waiting, SIGNAL, {"html": PAYLOADS}, actor=ACTOR)
    doomed = registry.get(TASK_FAILS).configure(unique_key=PAYLOADS[0]).enqueue(PAYLOADS[6])
    pgq.admin.cancel_job(doomed, actor=ACTOR, source="dashboard")
    flow = chain(
        registry.get(TASK_SUCCEEDS).s(*PAYLOADS[:4]), registry.get(TASK_FAILS).s(PAYLOADS[4])
    ).enqueue()
    raw = _insert_raw(engine)
    return Seeded(
        failed=failed,
        succeeded=succeeded,
        waiting=waiting,
        raw=[doomed, *raw],
        workflows=[flow.id],
        queues=[QUEUE, *(queue for _, queue in RAW_NAMES)],
        schedules=[SCHEDULE],
    )


def _insert_raw(engine: Engine) -> list[int]:
    ids = []
    with engine.begin() as connection:
        for (task, queue), state in zip(RAW_NAMES, ("failed", "queued", "succeeded"), strict=True):
            ids.append(
                connection.execute(
                    text(
                        """INSERT INTO pgqueue_jobs (task_name, queue, state, args, kwargs,
                               result, last_error, errors, unique_key, finished_at)
                           VALUES (:task, :queue, CAST(:state AS text), CAST(:args AS json),
                                   CAST(:kwargs AS json), CAST(:result AS json), :error,
                                   CAST(:errors AS jsonb), :key,
                                   CASE WHEN CAST(:state AS text) <> 'queued' THEN now() END)
                           RETURNING id"""
                    ),
                    {
                        "task": task,
                        "queue": queue,
                        "state": state,
                        "args": json.dumps(PAYLOADS),
                        "kwargs": json.dumps({p: p for p in PAYLOADS}),
                        "result": json.dumps({"html": PAYLOADS}),
                        "error": ERROR_TEXT,
                        "errors": json.dumps(
                            [{"attempt": 1, "at": p, "error": p} for p in PAYLOADS]
                        ),
                        "key": PAYLOADS[3] if state == "queued" else None,
                    },
                ).scalar_one()
            )
        # A ticket: the overview shows the queued one as its queue's oldest waiting job.
        connection.execute(
            text("INSERT INTO pgqueue_message_queue (job_id, queue) VALUES (:id, :queue)"),
            {"id": ids[1], "queue": RAW_NAMES[1][1]},
        )
    return ids
