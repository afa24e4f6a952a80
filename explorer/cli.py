"""`krill explorer`: serve the read-only audit explorer (web pages + JSON API) over the index.

Design decisions:
- Configuration is the root command's (`krill --config ... --set explorer.port=...`): the index
  database (`database.url`), the store (`store`, for records, evidence and headers) and the
  `explorer` section; flags override the section. No keystore is opened: the explorer holds no
  keys and sends no transactions.
- The first line printed is the URL being served (with the real port when `--port 0` asked for
  any free one), so scripts and tests can read it.
- Heavy imports (SQLAlchemy, Jinja2) happen inside the command, so `krill --help` stays instant.
- What an operator gets wrong at start-up is one line (`KrillError`, printed by the root command),
  not a traceback: a port that cannot be bound (in use, or privileged) and a database that cannot
  be opened (server down, bad credentials, not a URL). The database's URL is named with its
  password hidden, and the driver's reason is shown with the password cut out, should it echo it.
"""

from __future__ import annotations

import contextlib

import click

from krill.commands.context import current_config
from krill.errors import ConfigError


def _open_index(url: str):
    """`open_read_only(url)`, with a database that cannot be opened as one `DatabaseError` line."""
    from krill.explorer.database import open_read_only
    from krill.runtime import database_errors

    with database_errors(url, "database.url (or --db)", "the index database"):
        return open_read_only(url)


def _checked_db_flag(url: str) -> str:
    """`--db` is checked as `database.url` is (backend and driver), or a typo'd driver failed at import."""
    from pydantic import ValidationError

    from krill.config import DatabaseConfig

    try:
        return DatabaseConfig(url=url).url
    except ValidationError as exc:
        raise ConfigError(f"--db: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None


@click.command("explorer")
@click.option("--host", help="Address to listen on (default: explorer.host, 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), help="Port to listen on (default: explorer.port; 0: any free).")
@click.option("--db", "db_url", help="Index database URL (default: database.url).")
@click.option("--audit-report", type=click.Path(dir_okay=False),
              help="`krill audit --json` output or a demo summary.json to show audit status from.")
@click.option("--no-store", is_flag=True, help="Do not read the content store (pages show what the index holds).")
@click.option("--quiet", is_flag=True, help="Do not log requests.")
def explorer(host: str | None, port: int | None, db_url: str | None, audit_report: str | None, no_store: bool,
             quiet: bool) -> None:
    """Serve read-only pages and a JSON API over the index: versions, participants, contributions, evidence."""
    from krill.explorer.audit_status import AuditStatus
    from krill.explorer.server import make_explorer_server
    from krill.explorer.web import ExplorerApp
    from krill.runtime import open_configured_store

    config = current_config()
    section = config.explorer
    report = audit_report or section.audit_report
    with contextlib.ExitStack() as stack:
        db = _open_index(_checked_db_flag(db_url) if db_url else config.database.url)
        stack.callback(db.close)
        store = None if no_store or not section.use_store else stack.enter_context(open_configured_store(config))
        app = ExplorerApp(db, store, AuditStatus(report), section.page_size, section.max_page_size)
        host, port = host or section.host, section.port if port is None else port
        try:
            server = make_explorer_server(app, host, port, quiet)
        except OSError as exc:  # bind failed: the port is taken or not ours to use, or the host is not local
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port "
                              "(0: any free one) or --host, or stop what holds it") from None
        stack.callback(server.server_close)
        bound_host, bound_port = server.server_address[:2]
        click.echo(f"explorer: serving http://{bound_host}:{bound_port}/ (read-only; Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
