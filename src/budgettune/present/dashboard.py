"""optuna-dashboard over the study storage, read-only unless asked, with budgettune's views in it.

    app = make_app(url, allow_writes=False)     # WSGI: reads work, every write gets a 403
    serve(url, host="127.0.0.1", port=8080)     # `budgettune dashboard`; blocks until Ctrl-C

The views (memory × time scatter, study note) are built in `budgettune.present.dashboard_views`
and written by the search (`budgettune.study.publish`) through optuna-dashboard's own Python
API, so any optuna-dashboard shows them; this module only serves them.
"""

from __future__ import annotations

import json
import logging
import socketserver
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.simple_server import make_server as _wsgiref_server

import optuna_dashboard

from budgettune import storage as storage_mod
from budgettune.errors import UsageError

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "READ_ONLY_REASON",
    "SAFE_METHODS",
    "DashboardApp",
    "describe_server",
    "make_app",
    "make_server",
    "serve",
]

logger = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""HTTP methods served without --allow-writes (no optuna-dashboard route writes on these)."""
READ_ONLY_REASON = "budgettune dashboard is read-only; restart with --allow-writes"
"""The 403 body's ``reason`` (optuna-dashboard's own error bodies are ``{"reason": ...}``)."""
_DRAIN_LIMIT_BYTES = 16 * 1024 * 1024
MAX_PORT = 65535


class DashboardApp:
    """optuna-dashboard's WSGI app on a budgettune storage; refuses writes unless allowed.

    Every request whose method is not GET, HEAD or OPTIONS (delete a study, tell a trial, edit
    notes or user attrs, preferential feedback, artifacts, the schema-upgrade button) gets
    ``403`` with ``{"reason": READ_ONLY_REASON}`` unless ``allow_writes``.
    """

    __slots__ = ("_app", "_store", "allow_writes")

    def __init__(
        self, *, app: WSGIApplication, store: storage_mod.Storage, allow_writes: bool
    ) -> None:
        self._app = app
        self._store = store
        self.allow_writes = allow_writes

    @property
    def display_url(self) -> str:
        """The storage URL with its password masked."""
        return self._store.display_url

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if self.allow_writes or method in SAFE_METHODS:
            return self._app(environ, start_response)
        logger.info("refused %s %s: read-only", method, environ.get("PATH_INFO", ""))
        _drain(environ)
        body = json.dumps({"reason": READ_ONLY_REASON}).encode()
        start_response(
            "403 Forbidden",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    def close(self) -> None:
        """Release the storage's connections."""
        self._store.close()


def _drain(environ: WSGIEnvironment) -> None:
    # Closing a socket with an unread request body makes the kernel send a reset, which can
    # reach the client before our 403 does; read (and drop) a modest body first.
    try:
        remaining = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return
    if remaining > _DRAIN_LIMIT_BYTES:
        return
    stream = environ["wsgi.input"]
    while remaining > 0:
        chunk = stream.read(min(remaining, 65536))
        if not chunk:
            break
        remaining -= len(chunk)


def make_app(storage_url: str | None, *, allow_writes: bool) -> DashboardApp:
    """optuna-dashboard's WSGI app over the storage, read-only unless ``allow_writes``.

    The dashboard reads through our storage's Optuna RDBStorage (SQLite in WAL mode with a
    busy timeout), so a search can keep writing while it is open. Close the app when done.

    Raises:
        StorageError: nothing at ``storage_url``, or it cannot be reached.
        SchemaBehindError, SchemaAheadError: the schema does not match this budgettune.
    """
    store = storage_mod.open_storage(storage_url, create=False)
    try:
        app = optuna_dashboard.wsgi(store.optuna_storage)
    except BaseException:
        store.close()
        raise
    return DashboardApp(app=app, store=store, allow_writes=allow_writes)


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """The page fires several API calls at once; serve them side by side."""

    daemon_threads = True


class _LoggingHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        logger.debug("%s %s", self.address_string(), format % args)


def make_server(app: WSGIApplication, *, host: str, port: int) -> WSGIServer:
    """A threaded wsgiref server for ``app`` (port 0 picks a free port: see ``server_port``).

    Raises:
        UsageError: the address cannot be bound (port in use, unknown host).
    """
    try:
        return _wsgiref_server(
            host, port, app, server_class=_ThreadingWSGIServer, handler_class=_LoggingHandler
        )
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port "
            "or --host"
        ) from None


def describe_server(*, host: str, port: int, display_url: str, allow_writes: bool) -> str:
    """The one line `serve` logs: where the dashboard is and whether it is read-only."""
    mode = (
        "WRITES ALLOWED (--allow-writes): the page can delete studies and edit trials"
        if allow_writes
        else "read-only: requests that would change the store get 403; restart with "
        "--allow-writes to allow them"
    )
    return f"budgettune dashboard at http://{host}:{port}/dashboard/ on {display_url}, {mode}"


def serve(
    storage_url: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    allow_writes: bool = False,
    log: Callable[[str], None] | None = None,
) -> None:
    """Serve optuna-dashboard on the storage until interrupted (Ctrl-C returns normally).

    Args:
        storage_url: a SQLAlchemy URL or SQLite path; None means ``./budgettune.db``.
        host: the address to bind.
        port: the port (0 picks a free one; the logged line says which).
        allow_writes: let the page change the store (delete studies, tell trials, edit notes).
        log: receives the one line saying where the dashboard is and whether it is
            read-only; by default it is logged at INFO.

    Raises:
        StorageError: the storage cannot be used.
        UsageError: a port out of range, or an address that cannot be bound.
    """
    if not 0 <= port <= MAX_PORT:
        raise UsageError(f"--port must be within 0..{MAX_PORT} (0 picks a free one), got {port}")
    app = make_app(storage_url, allow_writes=allow_writes)
    try:
        server = make_server(app, host=host, port=port)
        line = describe_server(
            host=host,
            port=server.server_port,
            display_url=app.display_url,
            allow_writes=allow_writes,
        )
        (log or logger.info)(line)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            logger.info("dashboard stopped")
        finally:
            server.server_close()
    finally:
        app.close()
