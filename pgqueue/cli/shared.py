"""What the two command-line interfaces (``pgqueue`` and ``flask pgqueue``) share beyond their
commands: the output consoles, loading ``APP``, one-line errors with exit code 2 (and
``--debug``), the logging setup, and JSON output (the job reports' tables are in ``reports``).

Everything the commands print goes through this module (``console()``, ``echo``,
``print_error``, ``print_json``, the log formatter), which shows control characters in it as
``\x1b``-style text (``visible``): names, keys and errors are job data, written by any client.

Kept apart from the command modules so that each of them holds only its commands.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import click

from pgqueue.errors import PgQueueError, connection_failure, error_line
from pgqueue.sqlstates import is_bad_credentials, is_connection_error, is_undefined_table

# SQLAlchemy, psycopg, Rich and pgqueue's core are imported where a command uses them, never by
# ``pgqueue --help`` (they are most of a command's start-up time).
if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from pgqueue.core import PgQueue

# Wide enough for any row: a table printed to a file or a pipe is never cut or wrapped.
UNBOUNDED_WIDTH = 100_000

# Every C0 control but tab and newline (layout), DEL, and every C1 control (U+0080-U+009F,
# which some terminals read as ESC + a letter: U+009B is CSI).
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` safe to print on a terminal: each control character (ESC, BEL, CR, C1...)
    but newline and tab as its ``\\xNN`` escape, so it shows instead of acting."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def console() -> Console:
    """The Rich console the commands print their tables on (standard output), made for the
    output of this moment: a terminal's width, else ``COLUMNS``, else unbounded (a pipe or a
    file gets every row whole)."""
    output = _visible_console_class()(markup=False, highlight=False)
    if output.is_terminal or os.environ.get("COLUMNS"):
        return output
    return _visible_console_class()(markup=False, highlight=False, width=UNBOUNDED_WIDTH)


def error_console() -> Console:
    """The Rich console of the one-line errors (standard error)."""
    return _visible_console_class()(stderr=True, markup=False, highlight=False, soft_wrap=True)


def new_table(title: str) -> Table:
    """An empty Rich table titled ``title``, for ``console().print``."""
    from rich.table import Table

    return Table(title=title)


@functools.cache
def _visible_console_class() -> type[Console]:
    # Defined on first use, with Rich imported then: a command that prints neither a table nor
    # an error (``--help``, ``migrate``, ``worker``) never imports it. The consoles themselves
    # are made per use (each command prints once), so none outlives the stream it was made for.
    from rich.console import Console
    from rich.text import Text

    class VisibleConsole(Console):
        """A Rich console that shows control characters in the strings it prints (table cells
        and titles included: Rich turns each into text here), with no markup or highlighting:
        what is printed (queue and task names, error messages) comes from users and the
        database, and ``[...]`` in it must print as itself, not as style tags."""

        def render_str(self, text: str, **options: Any) -> Text:
            return super().render_str(visible(text), **options)

    return VisibleConsole


def echo(message: str = "", *, err: bool = False) -> None:
    """One line (or more) of plain output, control characters shown (``visible``)."""
    click.echo(visible(message), err=err)


def plural(count: int, noun: str) -> str:
    """``1 job``, ``2 jobs``, ``0 jobs``, ``1,200 jobs``."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def this_cli() -> str:
    """How the user types the command being run: ``pgqueue``, or ``flask pgqueue`` under Flask
    (the ``cli_name`` of the nearest ``OneLineErrors`` group)."""
    context = click.get_current_context(silent=True)
    while context is not None:
        if isinstance(context.command, OneLineErrors):
            return context.command.cli_name
        context = context.parent
    return OneLineErrors.cli_name


def in_this_cli(text: str) -> str:
    """``text`` with the ``pgqueue ...`` commands it suggests (in backticks, as the library's
    messages write them) as the user types them in this CLI: ``flask pgqueue ...`` under
    Flask, where the app comes from ``--app`` and no APP argument is given."""
    cli = this_cli()
    if cli == OneLineErrors.cli_name:
        return text
    return text.replace("`pgqueue worker APP ", f"`{cli} worker ").replace("`pgqueue ", f"`{cli} ")


class CommandError(click.ClickException):
    """A problem the user can fix, printed as one ``error: ...`` line; exit code 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        # Worded here, while the command runs: its CLI is known then, not when it is shown.
        super().__init__(in_this_cli(message))

    def show(self, file: Any = None) -> None:
        print_error(self.format_message())


def print_error(message: str) -> None:
    """``error: message`` on stderr, on one line whatever the message holds."""
    from rich.text import Text

    line = Text.assemble(("error:", "red"), " ", visible(" ".join(message.split())))
    error_console().print(line)


def number_or_none(text: str) -> int | None:
    """A command's whole-number argument, where ``none`` means no value (its range is the
    admin API's to check)."""
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a whole number or 'none'") from None


_FIX_APP = "name the PgQueue object, e.g. myapp.jobs:pgq"


def did_you_mean(name: str, known: list[str]) -> str:
    """``"did you mean 'x'?"`` for the known names ``name`` most likely meant (those whose
    last dotted part is ``name``, as a task's function name is of its registered
    ``module.function``, at most ``_MEANT`` of them, else the closest spelling), or ``""``
    when none is close."""
    ends = sorted(k for k in known if k.rpartition(".")[2] == name)
    close = ends[:_MEANT] or difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    more = " (or another of that name)" if len(ends) > _MEANT else ""
    return f"did you mean {' or '.join(repr(c) for c in close)}{more}?" if close else ""


def known_queues(pgq: PgQueue) -> list[str]:
    """The queues that have jobs or settings, sorted: the names a queue argument may mean."""
    return sorted(set(pgq.admin.queue_names()) | set(pgq.admin.queue_settings()))


# How many names ``did_you_mean`` offers at most.
_MEANT: Final = 3


def load_app(path: str) -> PgQueue:
    """Import ``module:attribute`` and return the PgQueue it names; under a host's command
    group (``flask pgqueue``), the host's queue instead (``host_queue``).

    Whatever else it names (a task, a function, a class) is refused without being called.
    """
    from pgqueue.core import PgQueue

    hosted = host_queue()
    if hosted is not None:
        return remember_queue(hosted)
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"APP {path!r} is not of the form module:attribute: {_FIX_APP}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"APP {path!r}: cannot import {module_name!r}: {exc}") from exc
    except PgQueueError as exc:
        # A task or setting the module declares that pgqueue refuses (a bad queue name...):
        # said with the import it came from, which the refusal alone does not name.
        raise CommandError(f"APP {path!r}: importing {module_name!r} failed: {exc}") from exc
    obj: Any = module
    for part in attribute.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise CommandError(f"APP {path!r}: {module_name!r} has no attribute {attribute!r}")
    if not isinstance(obj, PgQueue):
        if type(obj).__module__.startswith("pgqueue.contrib.flask"):
            # The Flask extension's object holds a queue per Flask app, made by init_app: only
            # the app knows its database and settings.
            raise CommandError(
                f"APP {path!r} is the Flask extension (pgqueue.contrib.flask.PgQueue), which "
                f"needs its Flask app: run `flask --app {module_name} pgqueue ...` "
                "(e.g. `flask pgqueue worker`)"
            )
        kind = obj.__name__ if isinstance(obj, type) else type(obj).__name__
        what = "the class" if isinstance(obj, type) else "a"
        raise CommandError(f"APP {path!r} is {what} {kind}, not a PgQueue: {_FIX_APP}")
    return remember_queue(obj)


def remember_queue(pgq: PgQueue) -> PgQueue:
    """Note the command's queue, so that an error message can name its database."""
    context = click.get_current_context(silent=True)
    if context is not None:
        context.meta[_QUEUE_KEY] = pgq
    return pgq


_QUEUE_KEY = "pgqueue.queue"
# Where a host's command group (``flask pgqueue``) puts the function giving its app's queue:
# the commands it adds from this CLI have no APP or --database-url to find one by.
HOST_QUEUE_KEY: Final = "pgqueue.host_queue"


def host_queue() -> PgQueue | None:
    """The queue of the host app whose command group runs this command, or None (``pgqueue``)."""
    context = click.get_current_context(silent=True)
    provider: Callable[[], PgQueue] | None = (
        context.meta.get(HOST_QUEUE_KEY) if context is not None else None
    )
    return provider() if provider is not None else None


def queue_for(database_url: str | None, *, schema_checked: bool = True) -> PgQueue:
    """The queue of a command that only touches tables: on ``--database-url`` when given, else
    on ``$PGQUEUE_DATABASE_URL`` or the embedded server. Its schema is checked
    (``with_current_schema``) unless ``schema_checked`` is False (``migrate`` fixes it)."""
    from pgqueue.core import PgQueue

    hosted = host_queue()
    if hosted is not None:
        pgq = remember_queue(hosted)
    else:
        pgq = remember_queue(PgQueue(database_url) if database_url else PgQueue())
    return with_current_schema(pgq) if schema_checked else pgq


def with_current_schema(pgq: PgQueue) -> PgQueue:
    """``pgq`` once its database's schema is at this pgqueue's head revision, else
    ``SchemaNotCurrent`` naming the fix: a command's statements are built for that revision,
    and on an older or newer schema they fail half-way or write what the schema does not
    mean."""
    from pgqueue import migrations

    with pgq.engine.connect() as connection:
        migrations.check_schema(connection)
    return pgq


database_option = click.option(
    "--database-url",
    envvar="PGQUEUE_DATABASE_URL",
    default=None,
    help="SQLAlchemy URL (default: $PGQUEUE_DATABASE_URL, else the embedded server).",
)


def problem_line(exc: BaseException, database: Callable[[], str | None]) -> str | None:
    """One line naming what went wrong and its fix, for the errors a user causes and can fix
    (schema not migrated, server down, login refused, bad input); None for anything else,
    which is a bug and keeps its traceback. ``database`` names the command's database."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    if isinstance(exc, PgQueueError):
        return str(exc)
    if not isinstance(exc, DBAPIError | psycopg.Error):
        return None
    failure = connection_failure(exc)  # the connection that could not be opened, named
    if failure is not None:
        return failure
    name = database()
    where = f" {name}" if name else ""
    if is_bad_credentials(exc):
        return (
            f"the server refused the login to database{where} ({error_line(exc)}): "
            "check the user and password of the database URL"
        )
    if is_undefined_table(exc):
        return f"pgqueue's tables are missing in database{where}: run `pgqueue migrate`"
    if is_connection_error(exc):
        return (
            f"connection to database{where} failed ({error_line(exc)}): check that the server "
            "is up and the database URL"
        )
    return f"database{where}: {error_line(exc)} (--debug shows the traceback)"


class OneLineErrors(click.Group):
    """A command group whose commands report a user's problem (see ``problem_line``) as one
    line and exit code 2; its ``--debug`` option shows the traceback instead. ``cli_name`` is
    how the user types it, for the commands its messages suggest."""

    cli_name = "pgqueue"

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        # The group's own options (``pgqueue --bogus``) are parsed here, outside ``invoke``.
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise OneLineUsageError(exc, self.cli_name) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise  # a group given no command shows its help, as asked
        except click.UsageError as exc:
            # A subcommand's arguments (a bad value, a missing or extra one, an unknown option
            # or command), at any depth below this group: one line, not click's usage block.
            if isinstance(exc, OneLineUsageError):
                raise
            raise OneLineUsageError(exc, self.cli_name) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            line = problem_line(exc, lambda: _database_name(ctx.meta.get(_QUEUE_KEY)))
            if line is None:
                raise
            print_error(in_this_cli(line))
            ctx.exit(2)


_DASH_DIGIT: Final = re.compile(r"-\d")


class OneLineUsageError(click.UsageError):
    """click's usage error (``Invalid value for '--state'...``, ``No such command``, ``Missing
    argument``) as one ``error: ...`` line naming the command, the problem and where its usage
    is (``pgqueue jobs --help``); exit code 2, as click's. Its message is worded when it is
    raised, with the command's path as the user types it in this CLI (``cli_name``)."""

    def __init__(self, exc: click.UsageError, cli_name: str) -> None:
        path = _command_path(exc.ctx, cli_name)
        problem = exc.format_message().strip().rstrip(".")
        if problem[:1].isupper() and problem[1:2].islower():
            problem = problem[0].lower() + problem[1:]
        if isinstance(exc, click.NoSuchOption) and _DASH_DIGIT.fullmatch(exc.option_name):
            # click reads a leading dash as an option, and names only its first two characters
            # (``-1`` of ``-12``); every number an argument takes here is an id, a count or a
            # limit, none of which may be negative.
            problem = "a negative number is read as an option; no argument here takes one"
        super().__init__(f"{path}: {problem} (see `{path} --help`)", ctx=exc.ctx)

    def show(self, file: Any = None) -> None:
        print_error(self.format_message())


def _command_path(ctx: click.Context | None, cli_name: str) -> str:
    """``pgqueue bulk retry``: the command of ``ctx`` as typed in this CLI (the outermost
    ``OneLineErrors`` group written as its ``cli_name``, whatever ran the program)."""
    chain: list[click.Context] = []
    while ctx is not None:
        chain.insert(0, ctx)
        ctx = ctx.parent
    for index, outer in enumerate(chain):
        if isinstance(outer.command, OneLineErrors):
            names = [c.info_name or "" for c in chain[index + 1 :]]
            return " ".join([outer.command.cli_name, *names])
    return cli_name


def _database_name(pgq: PgQueue | None) -> str | None:
    # Called for a database error only: the queue's engine exists by then, so asking for it
    # starts nothing.
    if pgq is None:
        return None
    try:
        return pgq.engine.url.database
    except Exception:  # naming the database must never hide the error being reported
        return None


debug_option = click.option(
    "--debug", is_flag=True, help="Show the traceback of an error instead of one line."
)
verbose_option = click.option(
    "-v", "--verbose", count=True, help="More logging (-v info, -vv debug)."
)


def configure_logging(verbose: int) -> None:
    """The logging of both CLIs: WARNING and up (``-v`` info, ``-vv`` debug) on stderr, and
    pgqueue's own INFO lines (a worker's start, jobs, shutdown) where a command asks for them."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler()
    handler.setFormatter(VisibleFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_quiet_embedded_notice)
    logging.basicConfig(level=level, handlers=[handler])


# The commands that keep the embedded server's WARNING: those that run jobs, where a
# deployment left without a database URL must notice.
_RUN_JOBS: Final = {"worker"}


def _quiet_embedded_notice(record: logging.LogRecord) -> bool:
    """Show the embedded server's fallback WARNING as an INFO line (``-v``) for commands that
    only read or set something, so it is not repeated on every one of them while trying the
    CLI; ``pgqueue worker`` keeps it. ``PGQUEUE_DATABASE_URL`` unset is said in the docs."""
    from pgqueue.engines import EMBEDDED_FALLBACK

    if not getattr(record, EMBEDDED_FALLBACK, False):
        return True
    context = click.get_current_context(silent=True)
    if context is not None and context.info_name in _RUN_JOBS:
        return True
    record.levelno, record.levelname = logging.INFO, "INFO"
    return logging.getLogger().getEffectiveLevel() <= logging.INFO


class VisibleFormatter(logging.Formatter):
    """Log lines for a terminal: the formatted record (message, job data in it, traceback)
    with its control characters shown (``visible``); a traceback keeps its newlines."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (stable keys) instead of a table."
)
actor_option = click.option(
    "--actor", default=None, help="Who acts, for the audit record (default: user@host)."
)


def checked_name(context: click.Context, parameter: click.Parameter, value: Any) -> Any:
    """An option's queue or task name (or names, comma-separated for ``--queues``), checked as
    every command and the library check one: a name no job can have is a typo, refused in one
    line rather than acted on. (``jobs`` lists the jobs of any name, which rows written by
    other clients may hold, and refuses such a name only when no job has it.)"""
    if value is None:
        return value
    from pgqueue import validation

    check = validation.task_name if parameter.name == "task_name" else validation.queue_name
    # ``--queues a,b``: each name, as the worker splits them.
    names = (
        [n.strip() for n in value.split(",") if n.strip()]
        if parameter.name == "queues"
        else [value]
    )
    if not names:  # ``--queues ''`` names none; all queues is what leaving it out means
        raise CommandError("--queues must name at least one queue (leave it out for all queues)")
    try:
        for name in names:
            check(name)
    except PgQueueError as exc:
        raise CommandError(str(exc)) from None
    return value


def print_json(data: Any) -> None:
    # json.dumps escapes every control character (ASCII output: C1 and DEL too); ``echo``
    # makes sure of it.
    echo(json.dumps(data, default=str, sort_keys=True))
