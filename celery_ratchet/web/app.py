"""The dashboard as a WSGI application: pages by GET, actions by POST with a CSRF token.

``Dashboard(store, auth=, read_only=, hosts=, secret=)`` is the WSGI callable ``ratchet web``
serves, and the one an application mounts under a prefix of its own (links follow
``SCRIPT_NAME``; docs/how-to/dashboard.md shows Django, Flask and FastAPI). ``GET /metrics``
is Prometheus' (:mod:`celery_ratchet.web.metrics`).
Each action is an operation of the store or the runtime that the CLI and Celery's remote
control use: see :mod:`celery_ratchet.web.actions`.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, parse_qsl

from celery_ratchet.errors import (
    InvalidArgument,
    RatchetError,
    StorePermissionDenied,
    ValueRefused,
)
from celery_ratchet.settings import mask_password
from celery_ratchet.store.read_ports import DashboardStore
from celery_ratchet.web import pages
from celery_ratchet.web.actions import Actions, Confirm, Done
from celery_ratchet.web.guard import Guard, HostAllowlist, ReadOnlyMode
from celery_ratchet.web.templating import STATIC, href, render, static_file, static_version
from celery_ratchet.web.workers import Workers

logger = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
Query = Mapping[str, list[str]]
#: Prometheus' scrape path: the store's metrics (celery_ratchet.web.metrics).
METRICS_PATH = "/metrics"
#: Largest form body read; the forms post a few short fields (bulk: a page of job ids).
MAX_BODY = 64 * 1024

_ACTIVE = {"/job": "/jobs", "/batch": "/batches", "/task": "/tasks", "/node": "/nodes"}
_TYPES = {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8"}
# Scripts and styles only from the dashboard's own files: injected markup could not run a
# script even if some value escaped the templates' escaping.
_HEADERS = [
    ("Content-Security-Policy",
     "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
     "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
]  # fmt: skip


class Refused(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class Dashboard:
    """``Dashboard(store)`` is a WSGI callable (``ratchet web`` serves it)."""

    def __init__(
        self,
        store: DashboardStore,
        *,
        auth: str | None = None,
        read_only: bool = False,
        hosts: HostAllowlist | None = None,
        secret: str | bytes | None = None,
        node_grace_seconds: float = 60.0,
    ) -> None:
        """``hosts``: the ``Host`` names answered (by default loopback names only), with
        or without auth: another site's name resolved to this address (DNS rebinding)
        is refused. ``secret``: the CSRF token's, shared by every process that serves the
        dashboard (an application's own secret key, where several processes serve it).
        ``node_grace_seconds``: a node silent for longer is not counted alive by
        ``/metrics`` (the workers' ``ratchet_node_orphan_grace_seconds``)."""
        self.store = store
        self.node_grace_seconds = node_grace_seconds
        self._metrics: Callable[..., Iterable[bytes]] | None = None
        self.guard = Guard(auth, secret)
        self.read_only = read_only
        self.hosts = hosts or HostAllowlist(frozenset(), loopback=True)
        self.workers = Workers(store, read_only=read_only)
        self.actions = Actions(store, self.workers)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        answer = self._answer(environ, start_response)
        # HEAD: the headers GET would send (Content-Length included), no body.
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else answer

    def _answer(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/") or "/"
        base = str(environ.get("SCRIPT_NAME", "")).rstrip("/")
        try:
            self._admit(environ)
            if method in ("GET", "HEAD") and path == METRICS_PATH:
                return self._exposition()({**environ, "REQUEST_METHOD": "GET"}, start_response)
            if method in ("GET", "HEAD"):
                if path.startswith("/static/"):
                    return self._static(path[len("/static/") :], start_response)
                query = parse_qs(environ.get("QUERY_STRING", ""))
                return self._page(path, query, base, start_response)
            if method == "POST":
                return self._act(path, _form(environ), base, start_response)
            raise Refused("405 Method Not Allowed", f"{method} is not served")
        except Refused as exc:
            extra = []
            if exc.status.startswith("401"):
                extra.append(("WWW-Authenticate", 'Basic realm="celery_ratchet"'))
            return self._send(start_response, exc.status, self._error(str(exc), base), extra)
        except ReadOnlyMode as exc:
            return self._send(start_response, "403 Forbidden", self._error(str(exc), base))
        except pages.NotFound as exc:
            return self._send(start_response, "404 Not Found", self._error(str(exc), base))
        except (pages.BadRequest, InvalidArgument) as exc:
            return self._send(start_response, "400 Bad Request", self._error(str(exc), base))
        except ValueRefused as exc:  # a value of the request the database cannot hold
            return self._send(
                start_response, "400 Bad Request", self._error(mask_password(str(exc)), base)
            )
        except StorePermissionDenied as exc:
            message = mask_password(str(exc))
            logger.warning("ratchet web: %s", message)
            if not self.read_only:
                message += (
                    "; a dashboard meant only to show the job store can be served read-only "
                    "(ratchet web --read-only), which needs SELECT alone"
                )
            return self._send(start_response, "403 Forbidden", self._error(message, base))
        except RatchetError as exc:
            message = mask_password(str(exc))
            logger.warning("ratchet web: %s", message)
            return self._send(start_response, "503 Service Unavailable", self._error(message, base))
        except Exception as exc:
            # Neither the message nor the traceback's locals: either may hold row contents.
            frames = traceback.extract_tb(exc.__traceback__)
            where = ([f for f in frames if "celery_ratchet" in f.filename] or frames)[-1]
            logger.error(
                "ratchet web: %s %s failed: %s at %s:%s",
                method, path, type(exc).__name__, where.filename, where.lineno,
            )  # fmt: skip
            message = "the page could not be made; the server's log says where it failed"
            return self._send(
                start_response, "500 Internal Server Error", self._error(message, base)
            )

    def _admit(self, environ: Mapping[str, Any]) -> None:
        if not self.guard.admits(environ):
            raise Refused("401 Unauthorized", "sign in: this dashboard asks for credentials")
        host = _host_name(str(environ.get("HTTP_HOST", "")))
        if host and not self.hosts.admits(host):
            raise Refused(
                "403 Forbidden", f"host {host!r} is not this dashboard's (see --allowed-host)"
            )

    def _exposition(self) -> Callable[..., Iterable[bytes]]:
        """``/metrics``' own WSGI application (prometheus_client's), made on first use."""
        if self._metrics is None:
            try:
                from celery_ratchet.web.metrics import StoreCollector, exposition
            except ImportError as exc:
                raise Refused(
                    "501 Not Implemented",
                    "/metrics needs prometheus_client: pip install celery-ratchet[metrics]",
                ) from exc
            collector = StoreCollector(self.store, node_grace_seconds=self.node_grace_seconds)
            self._metrics = exposition(collector)
        return self._metrics

    def _view(self) -> pages.View:
        return pages.View(self.store, self.read_only, self.workers)

    def _context(self, base: str, title: str, active: str, note: str | None) -> dict[str, Any]:
        def url(path: str, **query: Any) -> str:
            return href(base, path, query)

        return {
            "title": title,
            "active": active,
            "note": note,
            "read_only": self.read_only,
            "csrf": self.guard.csrf_token,
            "url": url,
            "base": base,
            "version": static_version(),
        }

    def _page(
        self, path: str, query: Query, base: str, start_response: StartResponse
    ) -> Iterable[bytes]:
        if path not in pages.PAGES:
            raise pages.NotFound(f"no page {path}")
        title, make = pages.PAGES[path]
        try:
            template, values = make(self._view(), query)
        except pages.Redirect as moved:
            location = href(base, moved.path, moved.query)
            return self._send(start_response, "303 See Other", "", [("Location", location)])
        note = self.guard.unsealed(_field(query, "note"), _field(query, "sig"))
        context = self._context(base, title, _ACTIVE.get(path, path), note)
        return self._send(start_response, "200 OK", render(template, {**context, **values}))

    def _static(self, name: str, start_response: StartResponse) -> Iterable[bytes]:
        if name not in STATIC:
            raise pages.NotFound(f"no file {name}")
        data = static_file(name)
        headers = [
            ("Content-Type", _TYPES[name.rpartition(".")[2]]),
            ("Content-Length", str(len(data))),
            ("Cache-Control", "public, max-age=86400"),
            *_HEADERS,
        ]
        start_response("200 OK", headers)
        return [data]

    def _act(
        self, path: str, form: Query, base: str, start_response: StartResponse
    ) -> Iterable[bytes]:
        if self.read_only and path in self.actions.paths:  # first: whatever the form holds
            raise ReadOnlyMode(f"{path} would write to the job store")
        if not self.guard.csrf_ok(_field(form, "csrf")):
            raise Refused("403 Forbidden", "the form's CSRF token is missing or wrong: reload")
        try:
            outcome = self.actions.run(path, form)
        except (pages.BadRequest, InvalidArgument):
            raise
        except (LookupError, ValueError) as exc:
            if isinstance(exc, pages.NotFound):
                raise
            # A KeyError's str() quotes its message; ratchet's own errors tell theirs.
            message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            return self._send(start_response, "409 Conflict", self._error(message, base))
        if isinstance(outcome, Confirm):
            context = self._context(base, "Confirm", "", None)
            html = render("confirm.html", {**context, "ask": outcome})
            return self._send(start_response, "200 OK", html)
        assert isinstance(outcome, Done)
        note = outcome.note
        target, _, kept = outcome.target.partition("?")
        query = {**dict(parse_qsl(kept)), **outcome.query, "note": note}
        location = href(base, target, {**query, "sig": self.guard.seal(note)})
        return self._send(start_response, "303 See Other", "", [("Location", location)])

    # -- responses ----------------------------------------------------------------------------

    def _error(self, message: str, base: str) -> str:
        context = self._context(base, "Error", "", None)
        return render("error.html", {**context, "message": message})

    def _send(
        self,
        start_response: StartResponse,
        status: str,
        html: str,
        extra: list[tuple[str, str]] | None = None,
    ) -> Iterable[bytes]:
        data = html.encode("utf-8")
        headers = [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Content-Length", str(len(data))),
            ("Cache-Control", "no-store"),
            *_HEADERS,
            *(extra or []),
        ]
        start_response(status, headers)
        return [data]


def _host_name(header: str) -> str:
    """``Host: [::1]:5580`` → ``::1``; ``localhost:5580`` → ``localhost``."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _form(environ: Mapping[str, Any]) -> Query:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > MAX_BODY:
        raise Refused("413 Content Too Large", f"a form of more than {MAX_BODY} bytes")
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    return parse_qs(body.decode("utf-8", "replace"))


def _field(form: Query, name: str) -> str | None:
    """The value as sent: never stripped (``nightly `` is not ``nightly``); only "" is none."""
    found = form.get(name)
    return found[0] if found and found[0] != "" else None
