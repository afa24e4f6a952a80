"""The explorer as a WSGI application: requests in, pages or JSON out, with security headers.

Design decisions:
- Plain WSGI over the standard library (served by `krill.explorer.server`) and Jinja2 templates:
  no web framework for a read-only site of a dozen pages, and the app can be tested by calling it.
- Read-only: only GET and HEAD are answered (405 otherwise); the database is opened read-only
  (`krill.explorer.database`); the explorer holds no keys and sends no transactions.
- Every response carries security headers: a Content-Security-Policy that allows no script at all
  (charts are inline SVG, styles come from one same-origin stylesheet), `nosniff`,
  `X-Frame-Options: DENY` (and `frame-ancestors 'none'`), `Referrer-Policy: no-referrer`.
  Templates autoescape everything; JSON is served as `application/json`.
- Errors are pages (or JSON objects) with the right status: 400 for a bad parameter, 404 for
  nothing there, 405, 503 when the database cannot be read; anything else is a 500 whose details
  go to the server's log, not to the client.
"""

from __future__ import annotations

import json
import sys
import traceback
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from krill.audit.report import finite  # JSON has no NaN or infinity: such floats become null
from krill.explorer.audit_status import AuditStatus
from krill.explorer.charts import overview_charts
from krill.explorer.paging import BadRequest, NotFound, page_request
from krill.explorer.routes import ROUTES, match, search_target
from krill.explorer.templating import FILTERS

MAX_QUERY_CHARS = 2000
SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; "
                                "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)
STATUS_TEXT = {200: "200 OK", 303: "303 See Other", 400: "400 Bad Request", 404: "404 Not Found",
               405: "405 Method Not Allowed", 500: "500 Internal Server Error", 503: "503 Service Unavailable"}


class RequestContext:
    """What a route's data function sees: the session, parsed query parameters, store, audit status."""

    def __init__(self, app: ExplorerApp, session, params: dict[str, str]):
        self.app, self.session, self.params = app, session, params
        self.store, self.audit = app.store, app.audit

    def page(self):
        return page_request(self.params, self.app.page_size, self.app.max_page_size)


class ExplorerApp:
    """The WSGI callable. `database` is a `krill.db.session.Database` (opened read-only by the CLI)."""

    def __init__(self, database, store=None, audit: AuditStatus | None = None, page_size: int = 25,
                 max_page_size: int = 200):
        self.database, self.store = database, store
        self.audit = audit or AuditStatus()
        self.page_size, self.max_page_size = page_size, max_page_size
        self.env = Environment(loader=PackageLoader("krill.explorer", "templates"),
                               autoescape=select_autoescape(default=True, default_for_string=True),
                               undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        self.env.filters.update(FILTERS)
        self.stylesheet = files("krill.explorer").joinpath("static/style.css").read_bytes()

    # ------------------------------------------------------------------ WSGI

    def __call__(self, environ, start_response):
        status, headers, body = self.respond(environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/"),
                                             environ.get("QUERY_STRING", ""))
        headers = [*headers, *SECURITY_HEADERS, ("Content-Length", str(len(body)))]
        start_response(STATUS_TEXT[status], headers)
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    def respond(self, method: str, path: str, query: str) -> tuple[int, list[tuple[str, str]], bytes]:
        api = path == "/api" or path.startswith("/api/")
        if method not in ("GET", "HEAD"):
            return self._error(405, "the explorer is read-only: only GET and HEAD are answered", api,
                               [("Allow", "GET, HEAD")])
        if path == "/static/style.css":
            return 200, [("Content-Type", "text/css; charset=utf-8")], self.stylesheet
        if path == "/api":
            return self._html(200, "api.html", {"routes": ROUTES}, {})
        try:
            params = self._params(query)
            if path == "/search":
                return 303, [("Location", search_target(params.get("q", ""), params.get("run")))], b""
            found = match((path.removeprefix("/api") or "/") if api else path)
            if found is None:
                raise NotFound(f"nothing at {path[:200]}")
            route, groups = found
            with self.database.session() as session:
                data = route.data(RequestContext(self, session, params), **groups)
            if api:
                return self._json(200, data)
            extra = {"charts": overview_charts(data["series"])} if route.template == "overview.html" else {}
            return self._html(200, route.template, {**data, **extra}, params)
        except BadRequest as exc:
            return self._error(400, str(exc), api)
        except NotFound as exc:
            return self._error(404, str(exc), api)
        except Exception as exc:  # the one place faults become responses; the log keeps the details
            from sqlalchemy.exc import OperationalError

            from krill.db.errors import DatabaseFullError  # an I/O error the database layer names as such

            traceback.print_exc(file=sys.stderr)
            if isinstance(exc, (OperationalError, DatabaseFullError)):
                return self._error(503, "the index database cannot be read right now; try again shortly", api)
            return self._error(500, "internal error (details are in the explorer's log)", api)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _params(query: str) -> dict[str, str]:
        if len(query) > MAX_QUERY_CHARS:
            raise BadRequest(f"query string over {MAX_QUERY_CHARS} characters")
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=False, max_num_fields=20)
        except ValueError as exc:
            raise BadRequest(f"malformed query string: {exc}") from None
        params: dict[str, str] = {}
        for key, value in pairs:
            params.setdefault(key, value)
        return params

    def _json(self, status: int, data: Any, headers: list[tuple[str, str]] | None = None):
        body = json.dumps(finite(data), sort_keys=True, separators=(",", ":"), allow_nan=False, default=str).encode()
        return status, [("Content-Type", "application/json"), *(headers or [])], body

    def _html(self, status: int, template: str, data: dict[str, Any], params: dict[str, str],
              headers: list[tuple[str, str]] | None = None):
        run = params.get("run")

        def link(path: str, **query: Any) -> str:
            items = {k: v for k, v in query.items() if v is not None}
            if run and "run" not in items:
                items = {"run": run, **items}
            return path + ("?" + urlencode(items) if items else "")

        body = self.env.get_template(template).render(d=data, params=params, link=link,
                                                      store=self.store is not None,
                                                      audit_source=self.audit.name).encode()
        return status, [("Content-Type", "text/html; charset=utf-8"), *(headers or [])], body

    def _error(self, status: int, message: str, api: bool, headers: list[tuple[str, str]] | None = None):
        if api:
            return self._json(status, {"error": message, "status": status}, headers)
        return self._html(status, "error.html", {"status": status, "message": message}, {}, headers)
