"""``pgqueue key-limit`` and ``pgqueue rate-limit`` (``flask pgqueue`` has them too): show,
set and remove the flow-control limits that operators change at run time.

Each command shows the current settings when given no value, sets one with a value, and
removes it with ``none``; each change writes one audit record (actor: ``--actor``, default
``user@host``; source ``cli``). Bad input (a count below 1, a window that is not a positive number
of seconds, an empty key) is refused by the admin API's checks before anything is written,
and reported as one line with exit code 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pgqueue.cli.queues import known_queue, new_option
from pgqueue.cli.shared import (
    CommandError,
    actor_option,
    console,
    database_option,
    echo,
    json_option,
    new_table,
    number_or_none,
    print_json,
    queue_for,
)

if TYPE_CHECKING:
    from pgqueue.admin import KeyOverride
    from pgqueue.core import PgQueue

# A limit of ``-3`` is a bad value to name in the error, not an unknown option; a mistyped
# option (``--jsn``) then arrives as an argument, and ``_refuse_unknown_options`` names it.
FLOW_COMMAND_SETTINGS: dict[str, Any] = {"ignore_unknown_options": True}


def _refuse_unknown_options(*arguments: str | None) -> None:
    """Refuse an argument that is a mistyped option rather than a name or a number."""
    for argument in arguments:
        if argument is not None and argument.startswith("--"):
            raise CommandError(f"no such option: {argument}")


@click.command(name="key-limit", context_settings=FLOW_COMMAND_SETTINGS)
@click.argument("key_or_prefix", required=False)
@click.argument("limit", required=False)
@json_option
@actor_option
@database_option
def key_limit(
    key_or_prefix: str | None,
    limit: str | None,
    as_json: bool,
    actor: str | None,
    database_url: str | None,
) -> None:
    """At most LIMIT running jobs per concurrency key starting with KEY_OR_PREFIX (``none``
    removes the override); without LIMIT, show it; without arguments, list every override."""
    pgq = queue_for(database_url)
    _refuse_unknown_options(key_or_prefix, limit)
    if key_or_prefix is None:
        _print_key_overrides(pgq.admin.key_overrides(), as_json=as_json)
        return
    from pgqueue import validation

    prefix = validation.concurrency_key(key_or_prefix, what="KEY_OR_PREFIX")
    if limit is None:
        found = {o.prefix: o for o in pgq.admin.key_overrides()}.get(prefix)
        key_limit = found.key_limit if found else None
        if as_json:
            print_json({"prefix": prefix, "key_limit": key_limit})
            return
        echo(f"keys {prefix}*: {'no limit override' if key_limit is None else key_limit}")
        return
    _refuse_json_with_a_value(as_json)
    value = number_or_none(limit)
    if value is None and prefix not in {o.prefix for o in pgq.admin.key_overrides() if o.key_limit}:
        # Removing what is not there changes nothing; saying "removed" would hide a typo.
        echo(f"keys {prefix}*: no limit override to remove (key-limit lists them)")
        return
    pgq.admin.set_key_limit(prefix, value, actor=actor, source="cli")
    echo(f"keys {prefix}*: limit {'removed' if value is None else value}")


@click.command(name="rate-limit", context_settings=FLOW_COMMAND_SETTINGS)
@click.argument("values", nargs=-1, metavar="[QUEUE] [LIMIT]")
@click.option("--key", default=None, metavar="PREFIX", help="Limit each key with this prefix.")
@click.option("--per", default=None, metavar="SECONDS", help="The window, in seconds.")
@new_option
@json_option
@actor_option
@database_option
def rate_limit(
    values: tuple[str, ...],
    key: str | None,
    per: str | None,
    new: bool,
    as_json: bool,
    actor: str | None,
    database_url: str | None,
) -> None:
    """At most LIMIT jobs of QUEUE (or of each key starting with --key PREFIX) start in any
    window of --per SECONDS (``none`` removes it); without LIMIT, show it; without arguments,
    list every rate limit."""
    pgq = queue_for(database_url)
    _refuse_unknown_options(*values)
    most = 1 if key is not None else 2
    if len(values) > most:
        usage = "--key PREFIX [LIMIT]" if key is not None else "[QUEUE [LIMIT]]"
        raise CommandError(f"rate-limit takes {usage}; unexpected argument {values[most]!r}")
    limit = values[-1] if len(values) == most else None
    if key is None and not values:
        if per is not None:
            raise CommandError("--per goes with a QUEUE (or --key PREFIX) and a LIMIT")
        _print_rates(pgq, as_json=as_json)
        return
    from pgqueue import validation

    queue = None if key is not None else values[0]
    if key is not None:
        target = f"keys {validation.concurrency_key(key, what='--key')}*"
    else:
        target = f"queue {validation.queue_name(queue)}"
    if limit is None:
        if per is not None:
            raise CommandError("--per goes with a LIMIT (the number of starts per window)")
        _print_one_rate(pgq, target, key=key, queue=queue, as_json=as_json)
        return
    _refuse_json_with_a_value(as_json)
    value = number_or_none(limit)
    if value is None and per is not None:
        raise CommandError("--per goes with a LIMIT; 'none' alone removes the rate limit")
    if value is not None and per is None:
        raise CommandError("a rate limit needs --per SECONDS, the window it counts starts in")
    window = None if per is None else _seconds(per)
    if queue is not None:
        if value is not None:  # a bad value is named before the queue is looked up
            validation.limit_count(value, what="rate limit")
            validation.rate_period(window)
        queue = known_queue(pgq, queue, new=new, doing="rate-limit")
    pgq.admin.set_rate_limit(queue, value, per=window, key=key, actor=actor, source="cli")
    shown = "removed" if value is None else _rate(value, window)
    echo(f"{target}: rate limit {shown}")


def _seconds(text: str) -> float:
    """``--per``'s number of seconds (its range is the admin API's to check)."""
    try:
        return float(text)
    except ValueError:
        raise CommandError(f"--per {text!r} is not a number of seconds") from None


def _refuse_json_with_a_value(as_json: bool) -> None:
    if as_json:
        raise CommandError("--json shows the settings; it does not go with a LIMIT")


def _rate(limit: int | None, per: float | None) -> str:
    if limit is None or per is None:
        return "none"
    return f"{limit} per {per:g}s"


def _print_key_overrides(overrides: list[KeyOverride], *, as_json: bool) -> None:
    if as_json:
        print_json(
            [
                {
                    "prefix": o.prefix,
                    "key_limit": o.key_limit,
                    "rate_limit": o.rate_limit,
                    "rate_per": o.rate_per,
                }
                for o in overrides
            ]
        )
        return
    table = new_table("pgqueue key limits (longest matching prefix wins)")
    table.add_column("prefix")
    table.add_column("key limit", justify="right")
    table.add_column("rate limit", justify="right")
    for o in overrides:
        limit = "task's" if o.key_limit is None else str(o.key_limit)
        table.add_row(o.prefix, limit, _rate(o.rate_limit, o.rate_per))
    console().print(table)


def _print_rates(pgq: PgQueue, *, as_json: bool) -> None:
    queues = [q for q in pgq.admin.queue_settings().values() if q.rate_limit is not None]
    keys = [o for o in pgq.admin.key_overrides() if o.rate_limit is not None]
    if as_json:
        print_json(
            {
                "queues": {q.name: _rate_record(q.rate_limit, q.rate_per) for q in queues},
                "keys": {o.prefix: _rate_record(o.rate_limit, o.rate_per) for o in keys},
            }
        )
        return
    table = new_table("pgqueue rate limits")
    table.add_column("applies to")
    table.add_column("limit", justify="right")
    table.add_column("per", justify="right")
    for q in sorted(queues, key=lambda q: q.name):
        table.add_row(f"queue {q.name}", str(q.rate_limit), f"{q.rate_per:g}s")
    for o in keys:
        table.add_row(f"keys {o.prefix}*", str(o.rate_limit), f"{o.rate_per:g}s")
    console().print(table)


def _rate_record(limit: int | None, per: float | None) -> dict[str, Any]:
    return {"rate_limit": limit, "rate_per": per}


def _print_one_rate(
    pgq: PgQueue, target: str, *, key: str | None, queue: str | None, as_json: bool
) -> None:
    from pgqueue.admin import QueueSettings

    if key is not None:
        override = {o.prefix: o for o in pgq.admin.key_overrides()}.get(key)
        limit, per = (override.rate_limit, override.rate_per) if override else (None, None)
        name = {"prefix": key}
    else:
        assert queue is not None
        found = pgq.admin.queue_settings().get(queue) or QueueSettings(queue, False, None, 0)
        limit, per = found.rate_limit, found.rate_per
        name = {"queue": queue}
    if as_json:
        print_json({**name, **_rate_record(limit, per)})
        return
    echo(f"{target}: {'no rate limit' if limit is None else _rate(limit, per)}")
