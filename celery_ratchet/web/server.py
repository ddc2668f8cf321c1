"""Serving the dashboard: the standard library's WSGI server, a thread per request."""

from __future__ import annotations

import socket
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from celery_ratchet.errors import ConfigurationError


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class IPv6ThreadingWSGIServer(ThreadingWSGIServer):
    address_family = socket.AF_INET6


#: Seconds a connection may take to send its request: a client that sends its headers
#: slowly, or not at all, would otherwise hold its thread for ever.
REQUEST_TIMEOUT = 30.0


class _QuietHandler(WSGIRequestHandler):
    """One line a request on stderr, without the query string (it may hold filter values)."""

    timeout = REQUEST_TIMEOUT

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.log_message('"%s %s" %s', self.command, self.path.split("?", 1)[0], code)


def make(host: str, port: int, app: Callable[..., Any]) -> WSGIServer:
    server_class = IPv6ThreadingWSGIServer if ":" in host else ThreadingWSGIServer
    try:
        return make_server(
            host.strip("[]"), port, app, server_class=server_class, handler_class=_QuietHandler
        )
    except OSError as exc:
        raise ConfigurationError(
            f"ratchet web cannot listen on {host}:{port}: {exc.strerror or exc}; "
            "pick another --port or --host"
        ) from exc
