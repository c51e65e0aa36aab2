"""pgqueue 0020: ``pgqueue_enqueue(...)``, a SQL function that enqueues a job.

Revision ID: pgqueue_0020
Revises: pgqueue_0019
Create Date: 2026-11-25

For database triggers and for clients in other languages: one call writes what Python's
``task.enqueue`` writes for the same inputs (the job row, its ticket, the wake-up on the
``pgqueue`` channel, the concurrency key's row, a bounded queue's check) after the same checks,
and returns the job's id; a unique key already held returns its holder's id. Bad input raises
with a SQLSTATE and a message naming the parameter, before anything is written. See
``docs/how-to/enqueue-from-sql.md``.

``SECURITY INVOKER`` (the caller's own table rights apply, so a role with the documented DML
grants can call it and a role without them cannot write through it); ``EXECUTE`` stays with
``PUBLIC``, PostgreSQL's default for a new function.

Creating and dropping a function takes no lock on any table. Nothing records which of the
host's own functions call this one (PL/pgSQL bodies are not tracked as dependencies): after a
downgrade, a trigger that calls it fails until the upgrade runs again.

The body repeats the rules of ``pgqueue.validation`` and the rows of ``pgqueue.sql.enqueue``
as they are at this revision; ``tests/integration/test_sql_enqueue.py`` holds the two to the
same rows and the same refusals.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "pgqueue_0020"
down_revision: str | Sequence[str] | None = "pgqueue_0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Numbers are bigint, not integer: a client that binds a 64-bit value (most drivers' default)
# then reaches the range check and its message, instead of "function does not exist".
# Parameters are read as ``pgqueue_enqueue.name``: several share a column's name.
#
# SQLSTATEs: 22004 a NULL where a value is needed; 22023 a value the rules refuse; 54000 the
# arguments are too large or nested too deep; PQ001 a bounded queue is full; 25000 a bounded
# queue in a REPEATABLE READ transaction.
ENQUEUE_FUNCTION = r"""
CREATE FUNCTION pgqueue_enqueue(
    task_name text,
    args jsonb DEFAULT '[]',
    kwargs jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    priority bigint DEFAULT 0,
    max_attempts bigint DEFAULT 3,
    run_at timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    unique_key text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    key_limit bigint DEFAULT NULL,
    atomic boolean DEFAULT false
) RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY INVOKER
AS $function$
-- Parameters are always read qualified; an unqualified name is a column (ON CONFLICT's
-- inference names unique_key, which is a parameter too).
#variable_conflict use_column
DECLARE
    args_text text;
    kwargs_text text;
    payload_bytes bigint;
    first_run_at timestamptz;
    bound integer;
    depth bigint;
    new_id bigint;
    job_run_at timestamptz;
BEGIN
    -- Names: pgqueue.config's NAME_PATTERN and TASK_NAME_PATTERN, at most 63 bytes. A refused
    -- value is quoted as a JSON string, cut: control characters escaped, the message one line.
    IF pgqueue_enqueue.task_name IS NULL THEN
        RAISE EXCEPTION 'task_name must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF octet_length(pgqueue_enqueue.task_name) > 63 THEN
        RAISE EXCEPTION 'task_name % is longer than 63 bytes',
            to_json(left(pgqueue_enqueue.task_name, 80)) USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.task_name !~ '^[A-Za-z_][A-Za-z0-9_.:<>\-]{0,62}$' THEN
        RAISE EXCEPTION 'task_name % has characters outside letters, digits and ''_.:-'' (and ''<>'')',
            to_json(left(pgqueue_enqueue.task_name, 80)) USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be NULL (omit it for the queue ''default'')'
            USING ERRCODE = '22004';
    END IF;
    IF octet_length(pgqueue_enqueue.queue) > 63 THEN
        RAISE EXCEPTION 'queue % is longer than 63 bytes',
            to_json(left(pgqueue_enqueue.queue, 80)) USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.queue !~ '^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,62}$' THEN
        RAISE EXCEPTION 'queue % has characters outside letters, digits and ''_.:-''',
            to_json(left(pgqueue_enqueue.queue, 80)) USING ERRCODE = '22023';
    END IF;

    -- Numbers: pgqueue.validation's PRIORITY_MIN..PRIORITY_MAX and MAX_ATTEMPTS_LIMIT.
    IF pgqueue_enqueue.priority IS NULL THEN
        RAISE EXCEPTION 'priority must not be NULL (omit it for the default, 0)'
            USING ERRCODE = '22004';
    END IF;
    IF pgqueue_enqueue.priority NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'priority must be within -32768..32767, got %', pgqueue_enqueue.priority
            USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.max_attempts IS NULL THEN
        RAISE EXCEPTION 'max_attempts must not be NULL (omit it for the default, 3)'
            USING ERRCODE = '22004';
    END IF;
    IF pgqueue_enqueue.max_attempts NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'max_attempts must be a whole number from 1 to 1000000, got %',
            pgqueue_enqueue.max_attempts USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.atomic IS NULL THEN
        RAISE EXCEPTION 'atomic must be true or false, not NULL' USING ERRCODE = '22004';
    END IF;

    -- When: run_at or delay (pgqueue.validation.MAX_DELAY_SECONDS), or now. A run_at must be
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

    -- Keys: pgqueue.validation.unique_key, concurrency_key and limit_count (text holds no NUL).
    IF pgqueue_enqueue.unique_key IS NOT NULL AND (
        pgqueue_enqueue.unique_key = '' OR length(pgqueue_enqueue.unique_key) > 512
    ) THEN
        RAISE EXCEPTION 'unique_key must be a non-empty string of at most 512 characters, got %',
            to_json(left(pgqueue_enqueue.unique_key, 80)) USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.concurrency_key IS NOT NULL AND (
        pgqueue_enqueue.concurrency_key = '' OR length(pgqueue_enqueue.concurrency_key) > 512
    ) THEN
        RAISE EXCEPTION 'concurrency_key must be a non-empty string of at most 512 characters, got %',
            to_json(left(pgqueue_enqueue.concurrency_key, 80)) USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.key_limit IS NOT NULL THEN
        IF pgqueue_enqueue.key_limit NOT BETWEEN 1 AND 2147483647 THEN
            RAISE EXCEPTION 'key_limit must be a whole number from 1 to 2147483647, got %',
                pgqueue_enqueue.key_limit USING ERRCODE = '22023';
        END IF;
        IF pgqueue_enqueue.concurrency_key IS NULL THEN
            RAISE EXCEPTION 'key_limit needs a concurrency_key' USING ERRCODE = '22023';
        END IF;
    END IF;

    -- Arguments: an array and an object; at most max_payload_bytes (1,000,000) as stored and
    -- max_json_depth (64) levels, Settings' defaults; and only numbers Python reads as given:
    -- an integer of more than 4300 digits (sys.get_int_max_str_digits()) fails to decode, and
    -- a fraction beyond a float's range decodes as infinity, which Python's enqueue refuses.
    IF pgqueue_enqueue.args IS NULL THEN
        RAISE EXCEPTION 'args must be a JSON array, not NULL (omit it for no arguments)'
            USING ERRCODE = '22004';
    END IF;
    IF jsonb_typeof(pgqueue_enqueue.args) <> 'array' THEN
        RAISE EXCEPTION 'args must be a JSON array, got %', jsonb_typeof(pgqueue_enqueue.args)
            USING ERRCODE = '22023';
    END IF;
    IF pgqueue_enqueue.kwargs IS NULL THEN
        RAISE EXCEPTION 'kwargs must be a JSON object, not NULL (omit it for no arguments)'
            USING ERRCODE = '22004';
    END IF;
    IF jsonb_typeof(pgqueue_enqueue.kwargs) <> 'object' THEN
        RAISE EXCEPTION 'kwargs must be a JSON object, got %', jsonb_typeof(pgqueue_enqueue.kwargs)
            USING ERRCODE = '22023';
    END IF;
    args_text := pgqueue_enqueue.args::text;
    kwargs_text := pgqueue_enqueue.kwargs::text;
    payload_bytes := octet_length(args_text) + octet_length(kwargs_text);
    IF payload_bytes > 1000000 THEN
        RAISE EXCEPTION 'task arguments are % bytes encoded; the limit is 1000000', payload_bytes
            USING ERRCODE = '54000';
    END IF;
    -- Level 0 is the array (object) itself and its items level 1, as Python counts them.
    IF jsonb_path_exists(
        pgqueue_enqueue.args, 'strict $.**{65} ? (@.type() == "array" || @.type() == "object")'
    ) THEN
        RAISE EXCEPTION 'args is nested deeper than 64 levels' USING ERRCODE = '54000';
    END IF;
    IF jsonb_path_exists(
        pgqueue_enqueue.kwargs, 'strict $.**{65} ? (@.type() == "array" || @.type() == "object")'
    ) THEN
        RAISE EXCEPTION 'kwargs is nested deeper than 64 levels' USING ERRCODE = '54000';
    END IF;
    -- Only numbers beyond the largest float are candidates; of those, the ones Python would read
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

    -- A bounded queue: its lock (pgqueue.sql.enqueue.QUEUE_LOCK_CLASS, the queue's hash), then
    -- its bound and depth read again in statements of their own, whose snapshots are taken
    -- after the lock (READ COMMITTED): the count covers every enqueue that held it before.
    IF EXISTS (
        SELECT FROM pgqueue_queues AS q
        WHERE q.name = pgqueue_enqueue.queue AND q.max_depth IS NOT NULL
    ) THEN
        IF current_setting('transaction_isolation') = 'repeatable read' THEN
            RAISE EXCEPTION 'queue % is bounded: enqueue into it in a READ COMMITTED or SERIALIZABLE transaction (under REPEATABLE READ its depth cannot be counted exactly)',
                quote_literal(pgqueue_enqueue.queue) USING ERRCODE = '25000';
        END IF;
        PERFORM pg_advisory_xact_lock(1885827428, hashtext(pgqueue_enqueue.queue));
        SELECT q.max_depth INTO bound
        FROM pgqueue_queues AS q
        WHERE q.name = pgqueue_enqueue.queue AND q.max_depth IS NOT NULL;
        IF bound IS NOT NULL THEN
            -- Counted up to one more than the bound, one index range per waiting state.
            SELECT least(
                (SELECT count(*) FROM (
                    SELECT FROM pgqueue_jobs AS j
                    WHERE j.queue = pgqueue_enqueue.queue AND j.state = 'queued' LIMIT bound + 1
                ) AS queued)
                + (SELECT count(*) FROM (
                    SELECT FROM pgqueue_jobs AS j
                    WHERE j.queue = pgqueue_enqueue.queue AND j.state = 'retrying' LIMIT bound + 1
                ) AS retrying)
                + (SELECT count(*) FROM (
                    SELECT FROM pgqueue_jobs AS j
                    WHERE j.queue = pgqueue_enqueue.queue AND j.state = 'waiting' LIMIT bound + 1
                ) AS waiting),
                bound + 1
            ) INTO depth;
            IF depth + 1 > bound THEN
                RAISE EXCEPTION 'queue % is full: % of at most % waiting jobs, 1 more asked for',
                    quote_literal(pgqueue_enqueue.queue),
                    CASE WHEN depth > bound THEN 'more than ' || bound ELSE depth::text END,
                    bound
                    USING ERRCODE = 'PQ001';
            END IF;
        END IF;
    END IF;

    -- The key's row (pgqueue.sql.flow.key_rows): an existing one held FOR KEY SHARE until the
    -- transaction ends, so maintenance cannot delete it under the new job; a missing one
    -- inserted (a conflict's DO UPDATE that changes nothing locks the other enqueue's row);
    -- a limit given replaces the row's.
    IF pgqueue_enqueue.concurrency_key IS NOT NULL THEN
        PERFORM FROM pgqueue_concurrency_keys AS k
        WHERE k.key = pgqueue_enqueue.concurrency_key
        FOR KEY SHARE;
        IF NOT FOUND THEN
            INSERT INTO pgqueue_concurrency_keys AS k (key, key_limit)
            VALUES (pgqueue_enqueue.concurrency_key, pgqueue_enqueue.key_limit)
            ON CONFLICT (key) DO UPDATE SET running = k.running WHERE false;
        END IF;
        IF pgqueue_enqueue.key_limit IS NOT NULL THEN
            UPDATE pgqueue_concurrency_keys AS k
            SET key_limit = pgqueue_enqueue.key_limit
            WHERE k.key = pgqueue_enqueue.concurrency_key
              AND k.key_limit IS DISTINCT FROM pgqueue_enqueue.key_limit;
        END IF;
    END IF;

    first_run_at := coalesce(
        pgqueue_enqueue.run_at, now() + coalesce(pgqueue_enqueue.delay, interval '0')
    );
    -- A held unique key (the partial unique index's predicate, models.UNIQUE_KEY_HELD) inserts
    -- nothing and returns the holder; a holder that finished in between is tried again.
    FOR attempt IN 1..10 LOOP
        INSERT INTO pgqueue_jobs AS j (
            task_name, queue, args, kwargs, priority, max_attempts, run_at, unique_key, atomic,
            concurrency_key
        )
        VALUES (
            pgqueue_enqueue.task_name, pgqueue_enqueue.queue, args_text::json, kwargs_text::json,
            pgqueue_enqueue.priority, pgqueue_enqueue.max_attempts, first_run_at,
            pgqueue_enqueue.unique_key, pgqueue_enqueue.atomic, pgqueue_enqueue.concurrency_key
        )
        ON CONFLICT (unique_key)
            WHERE unique_key IS NOT NULL AND state IN ('queued', 'running', 'retrying')
            DO NOTHING
        RETURNING j.id, j.run_at INTO new_id, job_run_at;
        IF new_id IS NOT NULL THEN
            -- The ticket and the wake-up (pgqueue.sql.common.tickets_for, wake_payload).
            INSERT INTO pgqueue_message_queue (
                job_id, queue, priority, run_at, atomic, key_hash, keyed
            )
            VALUES (
                new_id, pgqueue_enqueue.queue, pgqueue_enqueue.priority, job_run_at,
                pgqueue_enqueue.atomic,
                CAST(CAST('x' || substr(md5(pgqueue_enqueue.concurrency_key), 1, 8) AS bit(32))
                     AS integer),
                pgqueue_enqueue.concurrency_key IS NOT NULL
            );
            PERFORM pg_notify(
                'pgqueue',
                CASE
                    WHEN job_run_at <= statement_timestamp() THEN pgqueue_enqueue.queue
                    ELSE pgqueue_enqueue.queue || ' ' || CAST(extract(epoch FROM job_run_at) AS text)
                END
            );
            RETURN new_id;
        END IF;
        SELECT j.id INTO new_id
        FROM pgqueue_jobs AS j
        WHERE j.unique_key = pgqueue_enqueue.unique_key
          AND j.state IN ('queued', 'running', 'retrying');
        IF new_id IS NOT NULL THEN
            RETURN new_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'enqueue of unique_key % did not settle after 10 tries',
        to_json(left(pgqueue_enqueue.unique_key, 80));
END
$function$
"""

COMMENT = """
COMMENT ON FUNCTION pgqueue_enqueue(text, jsonb, jsonb, text, bigint, bigint,
    timestamp with time zone, interval, text, text, bigint, boolean)
IS 'Enqueue a pgqueue job from SQL, checked as Python''s enqueue checks it; returns its id (the
holder''s id for a held unique_key). See docs/how-to/enqueue-from-sql.md.'
"""

DROP_FUNCTION = """
DROP FUNCTION IF EXISTS pgqueue_enqueue(text, jsonb, jsonb, text, bigint, bigint,
    timestamp with time zone, interval, text, text, bigint, boolean)
"""


def upgrade() -> None:
    op.execute(ENQUEUE_FUNCTION)
    op.execute(COMMENT)


def downgrade() -> None:
    op.execute(DROP_FUNCTION)
