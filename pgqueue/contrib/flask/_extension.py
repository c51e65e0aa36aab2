"""The Flask extension: tasks declared at import time, one core ``pgqueue.PgQueue`` per app.

Tasks are declared on the extension (``@pgq.task``) before any app exists, as in an app
factory. ``init_app(app)`` reads the ``PGQUEUE_*`` config, builds a core queue for that app on
the Flask-SQLAlchemy engine (``db=`` or the one registered on the app; a separate jobs database
with ``PGQUEUE_DATABASE_URL``), registers every declared task on it
wrapped so the job runs inside ``app.app_context()``, and keeps that state in
``app.extensions["pgqueue"]``. The task objects users hold are proxies: ``enqueue`` finds the
current app's task and, when the extension knows ``db``, joins ``db.session`` so the job commits
or rolls back with the request's own writes.

With ``PGQUEUE_CONFIGURE_MIGRATE`` (the default), ``flask db migrate`` never proposes to drop
pgqueue's tables, whichever of ``Migrate(app, db)`` and ``init_app(app)`` runs first: the filter
is (re)installed on Flask-Migrate's configuration each time an app context of that app is pushed,
see :func:`_configure_flask_migrate`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, Unpack, overload

from flask import Flask, appcontext_pushed, current_app, has_app_context
from sqlalchemy.orm import Session

from pgqueue import migrations
from pgqueue.config import Settings
from pgqueue.core import PgQueue as CoreQueue
from pgqueue.errors import ConfigurationError, ValidationError
from pgqueue.tasks import ConfiguredTask, Task, TaskOptions, task_name_for
from pgqueue.workflows import Signature

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

P = ParamSpec("P")
R = TypeVar("R")

EXTENSION_KEY = "pgqueue"

# Config keys read by init_app, with their defaults. Settings fields can also be given as
# PGQUEUE_<FIELD> (e.g. PGQUEUE_LEASE_SECONDS); they override the environment.
DEFAULTS: dict[str, Any] = {
    "PGQUEUE_DATABASE_URL": None,  # None: the app's Flask-SQLAlchemy engine, else env/embedded
    "PGQUEUE_SETTINGS": None,  # a pgqueue.Settings to start from (default: from the env)
    "PGQUEUE_JOIN_SESSION": True,  # enqueue inside an app context joins db.session
    "PGQUEUE_CONFIGURE_MIGRATE": True,  # keep pgqueue's tables out of `flask db migrate`
}


@dataclasses.dataclass(slots=True)
class AppState:
    """What one app holds in ``app.extensions["pgqueue"]``; reach it with :func:`get_state`."""

    extension: PgQueue
    queue: CoreQueue
    db: SQLAlchemy | None
    join_session: bool
    tasks: dict[str, Task[Any, Any]]

    def request_session(self) -> Session | None:
        """The app's ``db.session`` (current scope) when enqueues should join it."""
        if self.join_session and self.db is not None:
            session: Session = self.db.session()
            return session
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Declaration:
    """A task as declared on the extension, before any app registers it."""

    fn: Callable[..., Any]
    name: str
    options: Mapping[str, Any]


class FlaskTask(Generic[P, R]):
    """A task declared on the Flask extension; resolves to the current app's core task.

    Calling it runs the function directly. ``enqueue``/``configure``/``enqueue_many`` need an
    app context; inside one (a request, a CLI command, a job) they join ``db.session`` unless
    ``session=`` is given or ``PGQUEUE_JOIN_SESSION`` is false.
    """

    def __init__(self, extension: PgQueue, declaration: _Declaration) -> None:
        self._extension = extension
        self._declaration = declaration
        self.fn: Callable[P, R] = declaration.fn
        self.name = declaration.name
        self.__doc__ = declaration.fn.__doc__
        self.__wrapped__ = declaration.fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<FlaskTask {self.name}>"

    def task_for(self, app: Flask | None = None) -> Task[P, R]:
        """The core task registered for ``app`` (default: the current app)."""
        task: Task[P, R] = self._extension.state(app).tasks[self.name]
        return task

    def configure(self, *, session: Session | None = None, **options: Any) -> ConfiguredTask[P, R]:
        state = self._extension.state()
        if session is None:
            session = state.request_session()
        return self.task_for().configure(session=session, **options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> int:
        """Enqueue one job (in ``db.session``'s transaction inside an app context)."""
        return self.configure().enqueue(*args, **kwargs)

    def enqueue_many(
        self, items: Iterable[Mapping[str, Any] | Sequence[Any]], *, session: Session | None = None
    ) -> list[int]:
        return self.configure(session=session).enqueue_many(items)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of the current app's task for a workflow (``Task.s``). A workflow is
        enqueued in its own transaction unless given one: ``.configure(session=db.session)``
        joins the request's."""
        return self.task_for().s(*args, **kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature of the current app's task (``Task.si``)."""
        return self.task_for().si(*args, **kwargs)


class PgQueue:
    """pgqueue as a Flask extension.

    The database is the app's Flask-SQLAlchemy one: ``db`` when given, else the ``SQLAlchemy``
    registered on the app (``app.extensions["sqlalchemy"]``). pgqueue then uses ``db.engine``,
    enqueues join ``db.session``, and handlers' ``db.session`` is committed when they return and
    removed after every job. ``PGQUEUE_DATABASE_URL`` in the config selects a separate jobs
    database instead. Only an app with neither falls back to ``$PGQUEUE_DATABASE_URL`` or the
    embedded development server. ``init_app`` must come after ``db.init_app`` (and after
    ``Migrate(app, db)`` for the automatic Flask-Migrate configuration).
    """

    def __init__(self, app: Flask | None = None, *, db: SQLAlchemy | None = None) -> None:
        self.db = db
        self._declarations: dict[str, _Declaration] = {}
        self._apps: weakref.WeakSet[Flask] = weakref.WeakSet()
        if app is not None:
            self.init_app(app)

    # -- registration ------------------------------------------------------------------------

    def init_app(self, app: Flask) -> None:
        """Set up pgqueue for ``app``; refuses an app that already has pgqueue registered."""
        if EXTENSION_KEY in app.extensions:
            raise RuntimeError(
                f"pgqueue is already registered on app {app.name!r}; call init_app once per app"
            )
        for key, value in DEFAULTS.items():
            app.config.setdefault(key, value)
        settings = _settings(app.config)
        url = app.config["PGQUEUE_DATABASE_URL"]
        db = self.db if self.db is not None else _app_sqlalchemy(app)
        if not url and db is None and "sqlalchemy" in app.extensions:
            # Another extension under that key (flask-sqlalchemy-lite, a custom one): the jobs
            # must not quietly land elsewhere than the app's data.
            kind = type(app.extensions["sqlalchemy"]).__name__
            raise ConfigurationError(
                f"app.extensions['sqlalchemy'] is a {kind}, not Flask-SQLAlchemy's SQLAlchemy: "
                "set PGQUEUE_DATABASE_URL to the database pgqueue should use"
            )
        join_session = False
        if url:
            # A separate jobs database: enqueues cannot share db.session's transaction.
            queue = CoreQueue(url, settings=settings)
        elif db is not None:
            try:
                with app.app_context():
                    engine = db.engine
            except RuntimeError as exc:  # Flask-SQLAlchemy: app not registered with db
                raise ConfigurationError(
                    "call db.init_app(app) before pgq.init_app(app): pgqueue reuses db.engine"
                ) from exc
            queue = CoreQueue(engine, settings=settings)
            join_session = bool(app.config["PGQUEUE_JOIN_SESSION"])
        else:
            queue = CoreQueue(None, settings=settings)
        state = AppState(self, queue, db, join_session, {})
        app.extensions[EXTENSION_KEY] = state
        for declaration in self._declarations.values():
            self._register(app, state, declaration)
        self._apps.add(app)
        if app.config["PGQUEUE_CONFIGURE_MIGRATE"]:
            _configure_flask_migrate(app)
            # Migrate(app, db) may come after this call (an app factory's natural order) and
            # replaces app.extensions["migrate"] with fresh configure_args; every `flask db`
            # command runs in an app context, so installing the filter again at each push
            # covers both orders. Connected for this app only; the receiver is a module
            # function, so blinker's weak reference to it never dies.
            appcontext_pushed.connect(_on_app_context_pushed, sender=app)

    def _register(self, app: Flask, state: AppState, declaration: _Declaration) -> None:
        wrapped = _in_app_context(app, state.db, declaration.fn)
        register = state.queue.task(name=declaration.name, **declaration.options)
        state.tasks[declaration.name] = register(wrapped)

    def state(self, app: Flask | None = None) -> AppState:
        """The per-app state (default: the current app's), refused for an app this extension
        is not registered on."""
        state = get_state(app)
        if state.extension is not self:
            name = (app or current_app).name
            raise RuntimeError(f"pgqueue (this extension) is not registered on app {name!r}")
        return state

    @property
    def queue(self) -> CoreQueue:
        """The current app's core ``pgqueue.PgQueue`` (job control, counts, workers)."""
        return self.state().queue

    def migrate(self, revision: str = "head") -> None:
        """Upgrade pgqueue's tables in the current app's database."""
        self.queue.migrate(revision)

    def run_worker(self, **options: Any) -> Any:
        """Run a worker for the current app in this thread (see ``pgqueue.PgQueue.run_worker``)."""
        return self.queue.run_worker(**options)

    # -- tasks -------------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> FlaskTask[P, R]: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, **options: Unpack[TaskOptions]
    ) -> Callable[[Callable[P, R]], FlaskTask[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> FlaskTask[P, R] | Callable[[Callable[P, R]], FlaskTask[P, R]]:
        """Declare a task (same options as ``pgqueue.PgQueue.task``); usable before init_app."""

        def declare(function: Callable[P, R]) -> FlaskTask[P, R]:
            task_name = task_name_for(function, name)
            existing = self._declarations.get(task_name)
            if existing is not None and existing.fn is not function:
                raise ValidationError(f"task name {task_name!r} is already declared; pass name=")
            declaration = _Declaration(function, task_name, dict(options))
            self._declarations[task_name] = declaration
            # Tasks declared after init_app (e.g. in a module imported late) still reach the apps.
            for app in list(self._apps):
                state = app.extensions[EXTENSION_KEY]
                if task_name not in state.tasks:
                    self._register(app, state, declaration)
            return FlaskTask(self, declaration)

        return declare(fn) if fn is not None else declare


def get_state(app: Flask | None = None) -> AppState:
    """The pgqueue state of ``app`` (default: the current app): its core queue, its tasks and
    its database. RuntimeError without an app context or when ``init_app`` did not run."""
    if app is None:
        if not has_app_context():
            raise RuntimeError(
                "no Flask app context: use `with app.app_context():` or pass the app"
            )
        app = current_app._get_current_object()  # type: ignore[attr-defined]
    assert app is not None
    state = app.extensions.get(EXTENSION_KEY)
    if not isinstance(state, AppState):
        raise RuntimeError(f"pgqueue is not registered on app {app.name!r}: call pgq.init_app(app)")
    return state


def _app_sqlalchemy(app: Flask) -> SQLAlchemy | None:
    """The Flask-SQLAlchemy extension registered on ``app``, if any."""
    registered = app.extensions.get("sqlalchemy")
    if registered is None:
        return None
    try:
        from flask_sqlalchemy import SQLAlchemy as FlaskSQLAlchemy
    except ImportError:
        return None
    return registered if isinstance(registered, FlaskSQLAlchemy) else None


def _settings(config: Mapping[str, Any]) -> Settings:
    base = config.get("PGQUEUE_SETTINGS")
    if base is not None and not isinstance(base, Settings):
        raise ConfigurationError(f"PGQUEUE_SETTINGS must be a pgqueue.Settings, got {base!r}")
    settings = base if base is not None else Settings.from_env()
    overrides = {
        f.name: config[f"PGQUEUE_{f.name.upper()}"]
        for f in dataclasses.fields(Settings)
        if f.name not in {"database_url", "extra"}
        and config.get(f"PGQUEUE_{f.name.upper()}") is not None
    }
    return settings.replace(**overrides) if overrides else settings


def _in_app_context(app: Flask, db: SQLAlchemy | None, fn: Callable[..., Any]) -> Any:
    """``fn`` wrapped to run in ``app.app_context()``: ``db.session`` is committed when it
    returns and removed afterwards either way (its uncommitted writes roll back on failure).

    ``functools.wraps`` keeps the signature visible, so the core still checks job arguments.
    """

    def finish(ok: bool) -> None:
        if db is None:
            return
        try:
            if ok:
                db.session.commit()
        finally:
            db.session.remove()

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with app.app_context():
                ok = False
                try:
                    result = await fn(*args, **kwargs)
                    ok = True
                    return result
                finally:
                    finish(ok)

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with app.app_context():
            ok = False
            try:
                result = fn(*args, **kwargs)
                ok = True
                return result
            finally:
                finish(ok)

    return run


def _on_app_context_pushed(app: Flask, **_: Any) -> None:
    """Receiver of Flask's ``appcontext_pushed`` for an app set up with Flask-Migrate."""
    _configure_flask_migrate(app)


def _configure_flask_migrate(app: Flask) -> None:
    """Make Flask-Migrate's autogenerate skip pgqueue's tables (chaining any host filter).

    Flask-Migrate's ``env.py`` reads ``current_app.extensions["migrate"].configure_args`` inside
    the command's app context and passes it to Alembic's ``context.configure``, so an
    ``include_object`` set there applies to ``flask db migrate``. ``Migrate.init_app`` builds a
    new ``configure_args`` each time, so this runs at ``init_app`` and again at every app
    context push (see ``init_app``) rather than patching Flask-Migrate. Idempotent and cheap
    (a few dict lookups when the filter is already in place), as it runs for every request: a
    filter marked ``_pgqueue_filter`` is left alone, any other (the host's) is wrapped and still
    consulted for the objects pgqueue does not own.
    """
    migrate_state = app.extensions.get("migrate")
    configure_args = getattr(migrate_state, "configure_args", None)
    if not isinstance(configure_args, dict):
        return
    host_filter = configure_args.get("include_object")
    if getattr(host_filter, "_pgqueue_filter", False):
        return

    def include_object(obj: Any, name: str | None, type_: str, reflected: bool, other: Any) -> bool:
        if not migrations.include_object(obj, name, type_, reflected, other):
            return False
        return host_filter is None or bool(host_filter(obj, name, type_, reflected, other))

    include_object._pgqueue_filter = True  # type: ignore[attr-defined]
    configure_args["include_object"] = include_object
