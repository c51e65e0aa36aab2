"""``pgqueue dashboard``: the dashboard as a server of its own (waitress), on a database alone
or with an APP for the task names and schedules in code; behind a login unless told otherwise
on a loopback address (``pgqueue.dashboard.standalone``)."""

from __future__ import annotations

import secrets

import click

from pgqueue.cli.shared import (
    CommandError,
    database_option,
    echo,
    load_app,
    queue_for,
    with_current_schema,
)

EXTRA_HINT = (
    "pgqueue dashboard needs the dashboard extra: pip install 'sqlalchemy-pgqueue[dashboard]'"
)


@click.command("dashboard")
@click.argument("app", required=False)
@click.option(
    "--bind",
    default="127.0.0.1:8321",
    show_default=True,
    metavar="HOST:PORT",
    help="Address to listen on (port 0: a free one, printed at start).",
)
@database_option
@click.option(
    "--auth-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Log in as one of its users (user:hash lines; see --hash-password) instead of with a "
    "printed token.",
)
@click.option(
    "--trust-header",
    metavar="HEADER",
    help="Believe a reverse proxy's header naming the user (e.g. X-Forwarded-User); only "
    "when nothing but that proxy can reach --bind.",
)
@click.option("--no-auth", is_flag=True, help="No login at all: only on a loopback --bind.")
@click.option(
    "--trusted-proxy",
    metavar="ADDRESS",
    help="The address the reverse proxy in front connects from ('*': any peer): believe its "
    "X-Forwarded-Proto (cookies marked Secure behind TLS) and X-Forwarded-For (the client "
    "address login throttling counts).",
)
@click.option(
    "--secret-file",
    type=click.Path(exists=True, dir_okay=False),
    help="Sign logins with the secret in this file (at least 32 bytes), so they survive a "
    "restart and every process sharing it accepts them (default: a random one per start).",
)
@click.option("--read-only", is_flag=True, help="Show every page, refuse every action.")
@click.option(
    "--threads", default=8, show_default=True, type=click.IntRange(1, 256), help="Pages at once."
)
@click.option(
    "--hash-password",
    metavar="USER",
    help="Ask for a password and print USER's --auth-file line, then exit.",
)
def dashboard(
    app: str | None,
    bind: str,
    database_url: str | None,
    auth_file: str | None,
    trust_header: str | None,
    no_auth: bool,
    trusted_proxy: str | None,
    secret_file: str | None,
    read_only: bool,
    threads: int,
    hash_password: str | None,
) -> None:
    """Serve the dashboard of the PgQueue at APP (module:attribute), or of the database alone.

    Logs in with a token printed once at start, unless --auth-file, --trust-header or
    --no-auth says otherwise.
    """
    try:
        from waitress import create_server

        from pgqueue.dashboard import passwords, standalone
    except ImportError as exc:
        raise CommandError(f"{EXTRA_HINT} ({exc})") from exc
    if hash_password is not None:
        if ":" in hash_password or not hash_password.strip():
            raise CommandError(f"user name {hash_password!r} must be non-empty, without ':'")
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
        click.echo(f"{hash_password}:{passwords.hash_password(password)}")
        return
    if sum(bool(x) for x in (auth_file, trust_header, no_auth)) > 1:
        raise CommandError("choose one of --auth-file, --trust-header and --no-auth")
    try:
        host, port = standalone.parse_bind(bind)
        users = passwords.Users.read(auth_file) if auth_file else None
        secret = standalone.read_secret(secret_file) if secret_file else None
    except Exception as exc:
        raise CommandError(str(exc)) from exc
    if no_auth and not standalone.is_loopback(host):
        raise CommandError(
            f"refusing to serve the dashboard on {host} without authentication: bind a "
            "loopback address, or drop --no-auth (a login token is then printed)"
        )
    token = None if (users or trust_header or no_auth) else secrets.token_urlsafe(24)
    auth = standalone.Auth(token=token, users=users, trust_header=trust_header)
    pgq = with_current_schema(load_app(app)) if app else queue_for(database_url)
    wsgi = standalone.application(pgq, auth, read_only=read_only, secret_key=secret)
    try:
        server = create_server(
            wsgi,
            host=host,
            port=port,
            threads=threads,
            ident="pgqueue",
            **standalone.server_options(trusted_proxy),
        )
    except OSError as exc:
        raise CommandError(f"cannot listen on {bind}: {exc.strerror or exc}") from exc
    shown = f"[{host}]" if ":" in host else host
    echo(f"pgqueue dashboard on http://{shown}:{server.effective_port}/")
    if token is not None:
        echo(f"log in with this token (shown once): {token}")
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        pgq.dispose()
