"""Database URLs with their credentials masked, for messages, logs and reports.

A URL is parsed with SQLAlchemy's own parser, so what is masked is exactly what the driver
would read as a credential: the password of the user information and every query parameter
that carries one (``password``, ``sslpassword``, ``token``, ...). What does not parse
unambiguously (no scheme, an ``@`` left unencoded in the password) is masked by the
conservative rules of :func:`celery_ratchet.settings.mask_password`, which hide too much
rather than too little.
"""

from __future__ import annotations

import re
from urllib.parse import quote_plus

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from celery_ratchet.settings import MASK, is_secret_key, mask_password

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


def mask_url(url: object) -> str:
    """``url`` with every credential replaced by ``***``; anything else left as it was."""
    text = str(url)
    match = _SCHEME.match(text.strip())
    # Two @ in one URL: SQLAlchemy would read part of the password as the host.
    if match is None or text.count("@") > 1:
        return mask_password(text, whole=True)
    try:
        parsed = make_url(text.strip())
    except (ArgumentError, ValueError):
        return mask_password(text, whole=True)
    secret_keys = [k for k in parsed.query if is_secret_key(k)]
    if parsed.password is None and not secret_keys:
        return text
    return _render(parsed, secret_keys)


def mask_secrets_of(url: object, text: str) -> str:
    """``text`` (a driver's error, say) with every credential of ``url`` masked, and every
    piece of its password: a password with an unencoded ``@`` reaches drivers partly as the
    host name, which their errors quote."""
    found = set()
    raw = str(url)
    head = re.match(r"\s*(?:[A-Za-z][\w+.\-]*:/*)?[^\s:/@]*:(?P<password>.*)@", raw)
    if head is not None:
        found.add(head["password"])
        found.update(head["password"].split("@"))
    try:
        parsed = make_url(raw.strip())
    except (ArgumentError, ValueError):
        parsed = None
    if parsed is not None:
        if parsed.password:
            found.add(str(parsed.password))
        for key, value in parsed.query.items():
            if is_secret_key(key):
                found.update(value if isinstance(value, tuple) else (value,))
    masked = mask_password(text)
    for secret in sorted((s for s in found if len(s) >= 3), key=len, reverse=True):
        masked = masked.replace(secret, MASK)
    return masked


def _render(parsed: URL, secret_keys: list[str]) -> str:
    rendered = parsed.set(query={}).render_as_string(hide_password=True)
    if not parsed.query:
        return rendered
    pairs = []
    for key, value in parsed.query.items():
        values = value if isinstance(value, tuple) else (value,)
        for one in values:
            shown = MASK if key in secret_keys else quote_plus(one)
            pairs.append(f"{quote_plus(key)}={shown}")
    return f"{rendered}?{'&'.join(pairs)}"
