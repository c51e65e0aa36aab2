"""pgqueue 0026: ``pgqueue_enqueue(...)`` holds times and numbers to Python's enqueue bounds.

Revision ID: pgqueue_0026
Revises: pgqueue_0025
Create Date: 2026-11-27

``pgqueue_enqueue(...)`` is replaced by the same function (same signature, same rows) with
three checks made exactly Python's:

- ``delay`` is measured as the moment it names: ``now() + delay`` must be neither before now
  nor more than 3650 days after it (``pgqueue.durations.MAX_DELAY_SECONDS``). Interval
  comparison counts a month as 30 days, so ``interval '121 months'`` compares below
  ``interval '3650 days'`` while naming a moment some 3,683 days away. A delay whose moment
  lies beyond the timestamp range is refused with the same message.
- ``run_at`` must lie within 3650 days of now, either way, as ``pgqueue.durations.run_at``
  requires: a time years away is a mistake, and one near the ends of the range is a time
  Python cannot read back (``get_job`` and every listing that holds the job would fail).

The days are the session ``TimeZone``'s calendar days, as ``now() + interval`` counts them:
where that zone keeps daylight saving time, 3650 of them may be an hour longer or shorter than
Python's 315,360,000 seconds.
- A number in ``args`` or ``kwargs``, at any depth, that Python would read as another value
  is refused naming the argument that holds it: besides the integers of more than 4300 digits
  and the fractions beyond a float's range, a non-zero fraction of at most ``2**-1075`` in
  magnitude, which Python reads as ``0.0`` (an enqueue from Python never stores one).

The downgrade puts 0023's function back. Replacing a function takes no lock on any table.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "pgqueue_0026"
down_revision: str | Sequence[str] | None = "pgqueue_0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_DECLARE = """    job_run_at timestamptz;
BEGIN"""
NEW_DECLARE = """    job_run_at timestamptz;
    unreadable text;
BEGIN"""

OLD_WHEN = """    -- When: run_at or delay (pgqueue.validation.MAX_DELAY_SECONDS), or now. A run_at must be
    -- one Python can read back (datetime holds years 1 to 9999, and no infinity).
    IF pgqueue_enqueue.run_at IS NOT NULL AND pgqueue_enqueue.delay IS NOT NULL THEN
        RAISE EXCEPTION 'give either delay or run_at, not both' USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.run_at IS NOT NULL AND (
        pgqueue_enqueue.run_at < '0001-01-01 00:00:00+00'
        OR pgqueue_enqueue.run_at >= '10000-01-01 00:00:00+00'
    ) THEN
        RAISE EXCEPTION 'run_at must be a finite time within years 1 to 9999, got %',
            pgqueue_enqueue.run_at USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.delay IS NOT NULL AND (
        pgqueue_enqueue.delay < interval '0' OR pgqueue_enqueue.delay > interval '3650 days'
    ) THEN
        RAISE EXCEPTION 'delay must be a non-negative interval of at most 3650 days, got %',
            pgqueue_enqueue.delay USING ERRCODE = '22023';
    END IF;
"""
NEW_WHEN = """    -- When: run_at or delay, or now; within 3650 days of now
    -- (pgqueue.validation.MAX_DELAY_SECONDS), measured between moments: compared as an
    -- interval a month counts 30 days, whatever the calendar makes of it from now.
    IF pgqueue_enqueue.run_at IS NOT NULL AND pgqueue_enqueue.delay IS NOT NULL THEN
        RAISE EXCEPTION 'give either delay or run_at, not both' USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.run_at IS NOT NULL AND (
        pgqueue_enqueue.run_at < now() - interval '3650 days'
        OR pgqueue_enqueue.run_at > now() + interval '3650 days'
    ) THEN
        RAISE EXCEPTION 'run_at must be a finite time within 3650 days of now, got %',
            pgqueue_enqueue.run_at USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.delay IS NOT NULL THEN
        -- A moment beyond the timestamp range is beyond the bound too (NULL here).
        BEGIN
            first_run_at := now() + pgqueue_enqueue.delay;
        EXCEPTION WHEN datetime_field_overflow THEN
            first_run_at := NULL;
        END;
        IF first_run_at IS NULL
           OR first_run_at < now()
           OR first_run_at > now() + interval '3650 days' THEN
            RAISE EXCEPTION 'delay must be a non-negative interval of at most 3650 days (from now, a month as long as the calendar makes it), got %',
                pgqueue_enqueue.delay USING ERRCODE = '22023';
        END IF;
    END IF;
"""

OLD_NUMBERS = """    -- Only numbers beyond the largest float are candidates; of those, the ones Python would read
    -- as a float (written with a fraction: jsonb writes no exponents) from 2^1024 - 2^970 on
    -- round to infinity, and every one from 10^4300 on is an integer too long or such a float.
    IF EXISTS (
        SELECT
        FROM jsonb_path_query(
            jsonb_build_array(pgqueue_enqueue.args, pgqueue_enqueue.kwargs),
            'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))'
        ) AS found(number)
        WHERE abs(found.number::numeric) >= 1e4300
           OR (scale(found.number::numeric) > 0
               AND abs(found.number::numeric) >= power(2::numeric, 1024) - power(2::numeric, 970))
    ) THEN
        RAISE EXCEPTION 'task arguments hold a number Python cannot read as given (an integer of more than 4300 digits, or a fraction beyond a float''s range)'
            USING ERRCODE = '22023';
    END IF;
"""
NEW_NUMBERS = """    -- Candidates: numbers beyond the largest float, and non-zero ones below half the smallest
    -- (2^-1075 rounds, a tie, to even). Of those, Python reads a fraction (jsonb writes no
    -- exponents: a fraction is a number with a scale) from 2^1024 - 2^970 on as infinity, and
    -- one of at most 2^-1075 as 0.0; every number from 10^4300 on is an integer too long or
    -- such a fraction. The argument holding one is looked for only once one is found.
    IF jsonb_path_exists(
        jsonb_build_array(pgqueue_enqueue.args, pgqueue_enqueue.kwargs),
        'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308 || (@ != 0 && @ < 2.4703282292062328e-324 && @ > -2.4703282292062328e-324)))'
    ) THEN
        SELECT named.what INTO unreadable
        FROM (
            SELECT 'args[' || (a.place - 1) || ']' AS what, a.value, 0 AS kind, a.place
            FROM jsonb_array_elements(pgqueue_enqueue.args) WITH ORDINALITY AS a(value, place)
            UNION ALL
            SELECT 'kwargs[' || to_json(left(k.key, 80)) || ']', k.value, 1, 0
            FROM jsonb_each(pgqueue_enqueue.kwargs) AS k
        ) AS named
        WHERE EXISTS (
            SELECT
            FROM jsonb_path_query(
                named.value,
                'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308 || (@ != 0 && @ < 2.4703282292062328e-324 && @ > -2.4703282292062328e-324)))'
            ) AS found(number)
            WHERE abs(found.number::numeric) >= 1e4300
               OR (scale(found.number::numeric) > 0
                   AND (abs(found.number::numeric)
                            >= power(2::numeric, 1024) - power(2::numeric, 970)
                        OR abs(found.number::numeric) * power(2::numeric, 1075) <= 1))
        )
        ORDER BY named.kind, named.place
        LIMIT 1;
        IF unreadable IS NOT NULL THEN
            RAISE EXCEPTION '% holds a number Python cannot read as given (an integer of more than 4300 digits, a fraction beyond a float''s range, or a non-zero fraction it reads as 0.0)',
                unreadable USING ERRCODE = '22023';
        END IF;
    END IF;
"""


def _function_0023() -> str:
    """0023's ``pgqueue_enqueue`` text, a ``CREATE OR REPLACE``."""
    path = Path(__file__).with_name("pgqueue_0023_unique_keys_held_while_waiting.py")
    spec = importlib.util.spec_from_file_location(
        "pgqueue_0023_unique_keys_held_while_waiting", path
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    body: str = module._function_0023()
    return body


def _replaced(text: str, old: str, new: str) -> str:
    """``text`` with its one occurrence of ``old`` replaced by ``new``."""
    if text.count(old) != 1:  # pragma: no cover - 0023's text is fixed
        raise RuntimeError(f"0023's pgqueue_enqueue does not hold {old[:60]!r} once")
    return text.replace(old, new)


def _function_0026() -> str:
    """``pgqueue_enqueue`` with the checks of this revision."""
    body = _replaced(_function_0023(), OLD_DECLARE, NEW_DECLARE)
    body = _replaced(body, OLD_WHEN, NEW_WHEN)
    return _replaced(body, OLD_NUMBERS, NEW_NUMBERS)


def upgrade() -> None:
    op.execute(_function_0026())


def downgrade() -> None:
    op.execute(_function_0023())
