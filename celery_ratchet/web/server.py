"""Serving the dashboard: waitress (the ``web`` extra) when it is installed, a production
server with a pool of threads that reads each request whole before handing it over; else
the standard library's WSGI server, a thread per request."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from celery_ratchet.errors import ConfigurationError

#: Seconds a connection may take to send its request: a client that sends its headers
#: slowly, or not at all, would otherwise hold its thread for ever.
REQUEST_TIMEOUT = 30.0
#: waitress' threads: pages are a few quick queries each, and live refresh polls.
THREADS = 8


class Server(Protocol):
    """What ``ratchet web`` needs of a server."""

    port: int
    kind: str

    def serve(self) -> None: ...

    def close(self) -> None: ...


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class IPv6ThreadingWSGIServer(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """One line a request on stderr, without the query string (it may hold filter values)."""

    timeout = REQUEST_TIMEOUT

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.log_message('"%s %s" %s', self.command, self.path.split("?", 1)[0], code)


class _Stdlib:
    kind = "the standard library's WSGI server"

    def __init__(self, server: WSGIServer) -> None:
        self.server = server
        self.port = int(server.server_port)

    def serve(self) -> None:
        self.server.serve_forever()

    def close(self) -> None:
        self.server.server_close()


class _Waitress:
    kind = "waitress"

    def __init__(self, server: Any) -> None:
        self.server = server
        self.port = int(server.effective_port)

    def serve(self) -> None:
        self.server.run()

    def close(self) -> None:
        self.server.close()


def make(host: str, port: int, app: Callable[..., Any]) -> WSGIServer:
    """The standard library's server (the fallback, and what tests may start in-process)."""
    server_class = IPv6ThreadingWSGIServer if ":" in host else ThreadingWSGIServer
    try:
        return make_server(
            host.strip("[]"), port, app, server_class=server_class, handler_class=_QuietHandler
        )
    except OSError as exc:
        raise _cannot_listen(host, port, exc) from exc


def serve(host: str, port: int, app: Callable[..., Any], *, prefer_stdlib: bool = False) -> Server:
    """A server bound to ``host:port`` for ``app``: waitress if installed, else the stdlib's."""
    try:
        from waitress.server import create_server
    except ImportError:
        create_server = None
    if create_server is None or prefer_stdlib:
        return _Stdlib(make(host, port, app))
    # waitress logs each refused or broken connection at INFO/WARNING under its own name.
    logging.getLogger("waitress").setLevel(logging.ERROR)
    try:
        server = create_server(
            app,
            host=host.strip("[]"),
            port=port,
            threads=THREADS,
            channel_timeout=REQUEST_TIMEOUT,
            ident="celery_ratchet",
            clear_untrusted_proxy_headers=True,
        )
    except OSError as exc:
        raise _cannot_listen(host, port, exc) from exc
    return _Waitress(server)


def _cannot_listen(host: str, port: int, exc: OSError) -> ConfigurationError:
    return ConfigurationError(
        f"ratchet web cannot listen on {host}:{port}: {exc.strerror or exc}; "
        "pick another --port or --host"
    )
