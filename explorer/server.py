"""Serving the explorer: a threaded HTTP server from the standard library.

Design decisions:
- `wsgiref` with one thread per request: enough for a read-only audit site, no dependency, and
  every request runs in its own short read transaction. The listening address defaults to
  127.0.0.1 (`explorer.host`); exposing it wider is the operator's explicit choice.
- Request lines go to the log in one short line each (method, path, status), not the library's
  default format; `quiet` silences them for tests and the demo.
"""

from __future__ import annotations

import socketserver
import sys
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(WSGIRequestHandler):
    quiet = False

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class names it so)
        if not self.quiet:
            sys.stderr.write(f"explorer: {self.command} {self.path[:200]} {args[1] if len(args) > 1 else ''}\n")


def make_explorer_server(app, host: str, port: int, quiet: bool = False) -> ThreadingWSGIServer:
    """A server bound to (host, port) serving `app` (port 0 picks a free port: see `server_port`)."""
    handler = type("Handler", (_Handler,), {"quiet": quiet})
    return make_server(host, port, app, server_class=ThreadingWSGIServer, handler_class=handler)
