"""The dashboard as a WSGI application: pages by GET, actions by POST with a CSRF token.

Each action is the CLI's own operation: ``ratchet dlq retry`` / ``retry --task`` / ``purge``
(:class:`~celery_ratchet.runtime.dlq.DeadLetterQueue`) and ``ratchet schedules pause`` /
``resume`` / ``remove`` (:mod:`celery_ratchet.runtime.recurring`).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlencode

from celery_ratchet.errors import RatchetError
from celery_ratchet.runtime import recurring
from celery_ratchet.runtime.dlq import DeadLetterQueue
from celery_ratchet.settings import mask_password
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.web import pages
from celery_ratchet.web.guard import Guard, HostAllowlist
from celery_ratchet.web.render import esc, page

logger = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
Query = Mapping[str, list[str]]
#: Largest form body read; the forms post a few short fields.
MAX_BODY = 64 * 1024

_PAGES: dict[str, tuple[str, Callable[[pages.View, Query], str]]] = {
    "/": ("Overview", pages.overview),
    "/jobs": ("Jobs", pages.jobs),
    "/job": ("Job", pages.job),
    "/dlq": ("Dead letters", pages.dlq),
    "/schedules": ("Schedules", pages.schedules),
    "/batches": ("Batches and workflows", pages.batches),
    "/batch": ("Batch", pages.batch),
    "/resources": ("Resources", pages.resources),
    "/nodes": ("Nodes", pages.nodes),
}
_ACTIVE = {"/job": "/jobs", "/batch": "/batches"}
# Injected markup could not run a script even if some value escaped esc(): none is allowed.
_HEADERS = [
    ("Content-Security-Policy",
     "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]  # fmt: skip


class Refused(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


class Dashboard:
    """``Dashboard(store)`` is a WSGI callable (``ratchet web`` serves it)."""

    def __init__(
        self,
        store: JobStore,
        *,
        auth: str | None = None,
        read_only: bool = False,
        hosts: HostAllowlist | None = None,
    ) -> None:
        """``hosts``: the ``Host`` names answered (by default loopback names only), with
        or without auth: another site's name resolved to this address (DNS rebinding)
        is refused."""
        self.store = store
        self.guard = Guard(auth)
        self.read_only = read_only
        self.hosts = hosts or HostAllowlist(frozenset(), loopback=True)
        self._actions: dict[str, Callable[[Query], tuple[str, str] | str]] = {
            "/dlq/retry": self._retry,
            "/dlq/retry-task": self._retry_task,
            "/dlq/purge": self._purge,
            "/schedules/pause": self._schedule(recurring.pause, "paused"),
            "/schedules/resume": self._schedule(recurring.resume, "resumed"),
            "/schedules/remove": self._schedule(recurring.cancel, "removed", confirm=True),
        }

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        answer = self._answer(environ, start_response)
        # HEAD: the headers GET would send (Content-Length included), no body.
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else answer

    def _answer(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/") or "/"
        try:
            self._admit(environ)
            if method in ("GET", "HEAD"):
                return self._page(path, parse_qs(environ.get("QUERY_STRING", "")), start_response)
            if method == "POST":
                return self._act(path, _form(environ), start_response)
            raise Refused("405 Method Not Allowed", f"{method} is not served")
        except Refused as exc:
            extra = []
            if exc.status.startswith("401"):
                extra.append(("WWW-Authenticate", 'Basic realm="celery_ratchet"'))
            return self._send(start_response, exc.status, self._error(str(exc)), extra)
        except pages.NotFound as exc:
            return self._send(start_response, "404 Not Found", self._error(str(exc)))
        except RatchetError as exc:
            message = mask_password(str(exc))
            logger.warning("ratchet web: %s", message)
            return self._send(start_response, "503 Service Unavailable", self._error(message))
        except Exception as exc:
            # Neither the message nor the traceback's locals: either may hold row contents.
            frames = traceback.extract_tb(exc.__traceback__)
            where = ([f for f in frames if "celery_ratchet" in f.filename] or frames)[-1]
            logger.error(
                "ratchet web: %s %s failed: %s at %s:%s",
                method, path, type(exc).__name__, where.filename, where.lineno,
            )  # fmt: skip
            message = "the page could not be made; the server's log says where it failed"
            return self._send(start_response, "500 Internal Server Error", self._error(message))

    def _admit(self, environ: Mapping[str, Any]) -> None:
        if not self.guard.admits(environ):
            raise Refused("401 Unauthorized", "sign in: this dashboard asks for credentials")
        host = _host_name(str(environ.get("HTTP_HOST", "")))
        if host and not self.hosts.admits(host):
            raise Refused(
                "403 Forbidden", f"host {host!r} is not this dashboard's (see --allowed-host)"
            )

    def _view(self) -> pages.View:
        return pages.View(self.store, self.guard.csrf_token, self.read_only)

    def _page(self, path: str, query: Query, start_response: StartResponse) -> Iterable[bytes]:
        if path not in _PAGES:
            raise pages.NotFound(f"no page {path}")
        title, render = _PAGES[path]
        try:
            body = render(self._view(), query)
        except pages.BadRequest as exc:
            return self._send(start_response, "400 Bad Request", self._error(str(exc)))
        note = self.guard.unsealed(_field(query, "note"), _field(query, "sig"))
        html = page(
            title, body, active=_ACTIVE.get(path, path), note=note, read_only=self.read_only
        )
        return self._send(start_response, "200 OK", html)

    def _act(self, path: str, form: Query, start_response: StartResponse) -> Iterable[bytes]:
        if not self.guard.csrf_ok(_field(form, "csrf")):
            raise Refused("403 Forbidden", "the form's CSRF token is missing or wrong: reload")
        if self.read_only:
            raise Refused("403 Forbidden", "this dashboard is read-only (--read-only)")
        action = self._actions.get(path)
        if action is None:
            raise pages.NotFound(f"no action {path}")
        try:
            outcome = action(form)
        except (LookupError, ValueError) as exc:
            # A KeyError's str() quotes its message; ratchet's own errors tell theirs.
            message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            return self._send(start_response, "409 Conflict", self._error(message))
        if isinstance(outcome, str):  # a confirmation page
            html = page("Confirm", outcome, active="", note=None, read_only=False)
            return self._send(start_response, "200 OK", html)
        target, note = outcome
        location = f"{target}?{urlencode({'note': note, 'sig': self.guard.seal(note)})}"
        return self._send(start_response, "303 See Other", "", [("Location", location)])

    # -- actions: the CLI's operations --------------------------------------------------------

    def _retry(self, form: Query) -> tuple[str, str] | str:
        job_id = _required(form, "job_id")
        count = DeadLetterQueue(self.store).retry(job_id)
        return "/dlq", f"requeued {count} job{'s' if count != 1 else ''}"

    def _retry_task(self, form: Query) -> tuple[str, str] | str:
        task = _required(form, "task")
        if _field(form, "confirmed") != "yes":
            return pages.confirm(
                self._view(), "/dlq/retry-task", {"task": task}, f"requeue every failed {task}"
            )
        count = DeadLetterQueue(self.store).retry_all(task_name=task)
        return "/dlq", f"requeued {count} job{'s' if count != 1 else ''} of {task}"

    def _purge(self, form: Query) -> tuple[str, str] | str:
        job_id, task = _field(form, "job_id"), _field(form, "task")
        if not (job_id or task or _field(form, "everything") == "1"):
            raise ValueError("purge: name a job_id or a task, or post everything=1")
        if _field(form, "confirmed") != "yes":
            values = {k: v for k, v in (("job_id", job_id), ("task", task)) if v}
            what = (
                f"delete failed job {job_id}"
                if job_id
                else f"delete every failed {task}"
                if task
                else "delete every failed job"
            )
            return pages.confirm(self._view(), "/dlq/purge", values or {"everything": "1"}, what)
        ids = (job_id,) if job_id else ()
        count = DeadLetterQueue(self.store).purge(*ids, task_name=task)
        return "/dlq", f"deleted {count} failed job{'s' if count != 1 else ''}"

    def _schedule(
        self, operation: Callable[[JobStore, str], None], done: str, *, confirm: bool = False
    ) -> Callable[[Query], tuple[str, str] | str]:
        def act(form: Query) -> tuple[str, str] | str:
            key = _required(form, "key")
            if confirm and _field(form, "confirmed") != "yes":
                return pages.confirm(
                    self._view(), "/schedules/remove", {"key": key}, f"remove schedule {key}"
                )
            operation(self.store, key)
            return "/schedules", f"{key}: {done}"

        return act

    # -- responses ----------------------------------------------------------------------------

    def _error(self, message: str) -> str:
        return page(
            "Error", f"<p>{esc(message)}</p>", active="", note=None, read_only=self.read_only
        )

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


def _required(form: Query, name: str) -> str:
    value = _field(form, name)
    if value is None:
        raise ValueError(f"the form has no {name}")
    return value
