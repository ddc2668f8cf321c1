"""Who may see the dashboard and which POSTs it accepts: optional HTTP basic auth or a
bearer token (``ratchet_web_auth``), and a CSRF token in every form."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_ratchet.errors import ConfigurationError


class ReadOnlyMode(Exception):
    """The dashboard is read-only and was asked for something that writes to the job store
    (answered 403)."""

    def __init__(self, what: str) -> None:
        super().__init__(
            "this dashboard is in read-only mode (ratchet web --read-only, or read_only=True "
            f"where an application mounts it): {what}, so it is refused"
        )


class Guard:
    """``auth``: ``user:password`` (basic) or a token (``Authorization: Bearer TOKEN``, or
    basic with any user name and the token as password); None lets everyone in.

    ``secret``: what the CSRF token and the notes' key are made from, for a dashboard that
    several processes serve (an application mounting it under gunicorn's workers): a form
    one of them rendered is then accepted by the others. Without it, each process has its
    own, made at random."""

    def __init__(self, auth: str | None, secret: str | bytes | None = None) -> None:
        auth = (auth or "").strip() or None
        if auth is not None and auth.startswith(":"):
            raise ConfigurationError(
                "ratchet_web_auth: give user:password or a token, not an empty user name"
            )
        self.auth = auth
        if secret is not None and len(secret) < 16:
            raise ConfigurationError(
                "the dashboard's secret: give at least 16 characters (an application's own "
                "secret key), or none for a token of this process alone"
            )
        #: A form rendered here carries it; an attacker's page cannot read it (same-origin
        #: policy), so cannot forge an action.
        self.csrf_token = (
            secrets.token_urlsafe(32) if secret is None else _derived(secret, "csrf").hex()
        )
        self._note_key = secrets.token_bytes(32) if secret is None else _derived(secret, "notes")

    @property
    def required(self) -> bool:
        return self.auth is not None

    def admits(self, environ: Mapping[str, Any]) -> bool:
        if self.auth is None:
            return True
        header = str(environ.get("HTTP_AUTHORIZATION", ""))
        scheme, _, credentials = header.partition(" ")
        credentials = credentials.strip()
        if scheme.lower() == "bearer":
            return ":" not in self.auth and _same(credentials, self.auth)
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        _user, _, password = decoded.partition(":")
        if ":" in self.auth:
            return _same(decoded, self.auth)
        return _same(password, self.auth)

    def csrf_ok(self, sent: str | None) -> bool:
        return sent is not None and _same(sent, self.csrf_token)

    def seal(self, note: str) -> str:
        """The signature a redirect's ``note`` carries: only this process's notes are shown."""
        return hmac.new(self._note_key, note.encode("utf-8"), hashlib.sha256).hexdigest()

    def unsealed(self, note: str | None, sig: str | None) -> str | None:
        """``note`` if this process signed it, else None (a link's own text is not shown)."""
        if note is None or sig is None:
            return None
        return note if _same(sig, self.seal(note)) else None


@dataclass(frozen=True)
class HostAllowlist:
    """The ``Host`` names a dashboard answers: ``names`` (lower case), and any loopback
    name when ``loopback``."""

    names: frozenset[str]
    loopback: bool

    def admits(self, host: str) -> bool:
        return host.lower() in self.names or (self.loopback and is_loopback(host))

    @classmethod
    def for_bind(cls, host: str, allowed: Iterable[str] = ()) -> HostAllowlist:
        """The bound address itself; loopback names when it is a loopback address; the
        machine's host name when it is every address (0.0.0.0, ::); plus ``allowed``."""
        bound = host.strip("[]").lower()
        names = {bound, *(a.strip("[]").lower() for a in allowed)}
        if bound in ("0.0.0.0", "::", ""):
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return cls(frozenset(names - {""}), loopback=is_loopback(bound))


def _derived(secret: str | bytes, purpose: str) -> bytes:
    """A key of its own for ``purpose``: the secret itself never leaves the process."""
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    return hmac.new(key, f"celery_ratchet dashboard {purpose}".encode(), hashlib.sha256).digest()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, guard: Guard, *, insecure_no_auth: bool) -> None:
    """Refuse to serve a non-loopback address to anyone who asks."""
    if is_loopback(host) or guard.required or insecure_no_auth:
        return
    raise ConfigurationError(
        f"ratchet web --host {host}: not a loopback address, and no ratchet_web_auth is set; "
        "set RATCHET_WEB_AUTH (user:password or a token), bind 127.0.0.1, or pass "
        "--insecure-no-auth to let anyone who reaches the port act on the job store"
    )
