"""Keeping a host application's own revisions out of pgqueue's lineage.

When a host lists ``pgqueue:migrations/versions`` in its ``version_locations``, Alembic's
``revision`` command, given no ``--head`` and no ``--version-path``, bases the new revision on
the only head it sees (pgqueue's, until the host has revisions of its own) and writes the file
beside that head: into pgqueue's package directory, chained after pgqueue's head. Once the host
has a branch of its own, the same command fails with "Multiple heads are present".

:func:`keep_host_revisions` returns a ``process_revision_directives`` hook for the host's
``env.py`` that decides both before Alembic does: the file goes to the host's first version
location, and the revision is based on the host's own head (or starts the host's branch, with
its branch label, when the host has no revision yet). Alembic runs the hook for
``--autogenerate``, and for a plain ``alembic revision`` only when ``revision_environment =
true``; so when pgqueue's revisions are listed without that setting, the hook's factory (run by
every command that loads ``env.py``) refuses with a line saying so.

:func:`configure_args` is what a host's ``env.py`` passes to ``context.configure``: the host's
own ``include_object`` and ``process_revision_directives`` (Flask-Migrate's env.py has one that
drops an empty autogenerate) chained after pgqueue's, so both run and neither is passed twice.

:func:`running_alembic_upgrade` and :func:`lists_pgqueue_revisions` tell
:func:`pgqueue.migrations.upgrade_with_host` when a host's ``env.py`` should take pgqueue's
tables to their head first: on an upgrade, unless the host's own Alembic runs pgqueue's
revisions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

# Alembic is imported where it is used: ``pgqueue.migrations`` imports this module, and a
# schema check (every command's start) must not cost Alembic's import.
if TYPE_CHECKING:
    from alembic.operations.ops import MigrationScript
    from alembic.runtime.migration import MigrationContext
    from alembic.script import Script, ScriptDirectory

    RevisionHook = Callable[[MigrationContext, Any, list[MigrationScript]], None]

IncludeObject = Callable[[Any, "str | None", str, bool, Any], bool]

REVISION_PREFIX: Final = "pgqueue_"
PGQUEUE_VERSIONS: Final = Path(__file__).resolve().parent / "versions"


def keep_host_revisions(branch_label: str | None = None) -> RevisionHook:
    """A ``process_revision_directives`` hook for a host's ``env.py`` that writes the host's new
    revisions into the host's own version directory (the first of ``version_locations`` that is
    not pgqueue's) and bases them on the host's own head. The host's first revision starts its
    branch, labelled ``branch_label`` when given (so ``alembic downgrade app@-1`` names it).

    An explicit ``--head`` or ``--version-path`` that points into pgqueue's lineage is refused:
    a host revision chained after pgqueue's head would become part of pgqueue's branch.
    """

    _check_revision_environment()

    def hook(context: MigrationContext, revision: Any, directives: list[MigrationScript]) -> None:
        script = context.script
        if script is None:  # only while Alembic writes a revision is there a script directory
            return
        if not lists_pgqueue_revisions():
            return  # pgqueue's lineage is not in this history: Alembic's own choice stands
        for directive in directives:
            _place(script, directive, branch_label)

    return hook


def configure_args(
    include_object: IncludeObject | None = None,
    process_revision_directives: RevisionHook | None = None,
    *,
    branch_label: str = "app",
    **other: Any,
) -> dict[str, Any]:
    """The keyword arguments for ``context.configure(...)`` in a host's ``env.py``: ``other``
    as given, with ``include_object`` and ``process_revision_directives`` that run pgqueue's
    (:func:`~pgqueue.migrations.include_object`, :func:`keep_host_revisions`) and then the
    host's own, when given. Flask-Migrate's env.py passes its ``configure_args`` through it:
    ``conf_args = configure_args(**conf_args)``.
    """
    from pgqueue.migrations.autogenerate import include_object as pgqueue_include

    keep = keep_host_revisions(branch_label=branch_label)

    def include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        if not pgqueue_include(obj, name, type_, reflected, compare_to):
            return False
        return include_object is None or include_object(obj, name, type_, reflected, compare_to)

    def directives_hook(
        context: MigrationContext, revision: Any, directives: list[MigrationScript]
    ) -> None:
        # pgqueue's placement first, so the host's hook sees (and may still drop) the revision
        # as it will be written.
        keep(context, revision, directives)
        if process_revision_directives is not None:
            process_revision_directives(context, revision, directives)

    return {**other, "include_object": include, "process_revision_directives": directives_hook}


def _check_revision_environment() -> None:
    # Called from env.py, so the first `alembic upgrade` already says what is missing: without
    # revision_environment a plain `alembic revision` never runs this hook, and writes into
    # pgqueue's package.
    from alembic import context

    try:
        config = context.config
    except (AttributeError, NameError):  # not inside an Alembic command
        return
    separator = config.get_main_option("path_separator")
    if "pgqueue:" in (config.get_main_option("version_locations") or "") and separator not in {
        None,
        "space",
    }:
        # `path_separator = os` (what `alembic init` writes) cut "pgqueue:migrations/versions"
        # at its ":".
        raise _refused(
            "alembic.ini's version_locations names pgqueue:migrations/versions, which the "
            "path_separator splits at its ':'; set `path_separator = space` under [alembic] "
            "(replacing the `path_separator = os` line)"
        )
    if lists_pgqueue_revisions() and not config.get_alembic_boolean_option("revision_environment"):
        raise _refused(
            "alembic.ini lists pgqueue's revisions in version_locations but not "
            "`revision_environment = true`: without it a plain `alembic revision` is written into "
            "pgqueue's package; add it under [alembic]"
        )


def lists_pgqueue_revisions() -> bool:
    """Whether the running Alembic command's ``version_locations`` list pgqueue's revisions
    (False outside an Alembic command)."""
    from alembic import context

    try:
        config = context.config
    except (AttributeError, NameError):  # not inside an Alembic command
        return False
    return any(
        location.startswith("pgqueue:") or Path(location).resolve() == PGQUEUE_VERSIONS
        for location in config.get_version_locations_list() or []
    )


def running_alembic_upgrade() -> bool:
    """Whether ``env.py`` runs for Alembic's ``upgrade`` command, online (``alembic upgrade``,
    and ``flask db upgrade``, which calls it)."""
    from alembic import context

    # The environment of the running command, and the step function the command gave it:
    # Alembic's public API says what the destination revision is, not which way it lies.
    environment = getattr(context, "_proxy", None)
    options: dict[str, Any] = getattr(environment, "context_opts", None) or {}
    step = options.get("fn")
    return (
        getattr(step, "__module__", None) == "alembic.command"
        and getattr(step, "__qualname__", None) == "upgrade.<locals>.upgrade"
        and not options.get("as_sql")
    )


def _place(script: ScriptDirectory, directive: MigrationScript, branch_label: str | None) -> None:
    if directive.version_path is None:
        directive.version_path = str(_host_directory(script))
    elif Path(directive.version_path).resolve() == PGQUEUE_VERSIONS:
        raise _refused(
            f"--version-path {directive.version_path} is pgqueue's own directory (inside its "
            "package): your revisions belong in yours"
        )
    # The command line leaves ``head`` unset without ``--head``; ``command.revision()`` says
    # "head". Both mean Alembic's default: the only head there is, pgqueue's at first.
    if directive.head in {None, "head"}:
        heads = [rev for rev in _scripts(script, "heads") if not _is_pgqueue(rev)]
        if len(heads) > 1:
            raise _refused(
                "your revisions have several heads ("
                + ", ".join(rev.revision for rev in heads)
                + "): pass --head, or merge them (`alembic merge`)"
            )
        if heads:
            directive.head = heads[0].revision
        else:
            directive.head = "base"
            if branch_label and not directive.branch_label:
                directive.branch_label = branch_label
        return
    pgqueue_heads = [rev for rev in _scripts(script, directive.head) if _is_pgqueue(rev)]
    if pgqueue_heads:
        raise _refused(
            f"--head {directive.head} is pgqueue's revision {pgqueue_heads[0].revision}: a "
            "revision of yours chained after it would join pgqueue's branch; base it on your "
            "own head, and add --depends-on pgqueue@head if it needs pgqueue's tables first"
        )


def _host_directory(script: ScriptDirectory) -> Path:
    locations: Sequence[Path] = script._version_locations
    for location in locations:
        if location.resolve() != PGQUEUE_VERSIONS:
            return location
    raise _refused(
        "version_locations lists only pgqueue's directory: list your own first, e.g. "
        "`version_locations = %(here)s/migrations/versions pgqueue:migrations/versions`"
    )


def _scripts(script: ScriptDirectory, revision: Any) -> list[Script]:
    return [rev for rev in script.get_revisions(revision) if rev is not None]


def _is_pgqueue(revision: Script) -> bool:
    in_package = Path(revision.path).resolve().parent == PGQUEUE_VERSIONS
    return in_package or revision.revision.startswith(REVISION_PREFIX)


def _refused(message: str) -> Exception:
    """Alembic's own error for a refused command (Alembic prints it as one line)."""
    from alembic.util import CommandError

    return CommandError(message)
