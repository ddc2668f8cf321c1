"""The dashboard's pages are Jinja2 templates (``web/templates``) with autoescaping on: every
value from the database is text in the page, never markup. Jinja2 comes with the ``web``
extra; without it the dashboard says which extra to install."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from celery_ratchet.errors import ConfigurationError

try:
    import jinja2
    from markupsafe import Markup
except ImportError:  # pragma: no cover - the bare install
    jinja2 = None  # type: ignore[assignment]

NAV = (
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/tasks", "Tasks"),
    ("/queues", "Queues"),
    ("/nodes", "Workers"),
    ("/dlq", "Dead letters"),
    ("/schedules", "Schedules"),
    ("/batches", "Batches"),
    ("/resources", "Resources"),
)
STATIC = ("dashboard.css", "dashboard.js")


def shown(value: Any) -> str:
    """A stored value as text: times to the second, lists and dicts as JSON."""
    if value is None:
        return ""
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def duration(seconds: float | None) -> str:
    """``0.42 s``, ``3.1 s``, ``4 min 12 s``, ``2 h 05 min``; blank for none."""
    if seconds is None:
        return ""
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    if seconds < 86400 * 2:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
    return f"{seconds / 86400:.1f} d"


def href(base: str, path: str, query: Mapping[str, Any] | None = None) -> str:
    """``path`` under the prefix the dashboard is mounted at (WSGI ``SCRIPT_NAME``), with
    the non-empty values of ``query``."""
    wanted = {k: v for k, v in (query or {}).items() if v not in (None, "", False)}
    return base + path + ("?" + urlencode(wanted, doseq=True) if wanted else "")


@cache
def static_version() -> str:
    """A digest of the static files: their URLs change when they do (cached a day)."""
    digest = hashlib.sha256()
    for name in STATIC:
        digest.update(static_file(name))
    return digest.hexdigest()[:12]


def static_file(name: str) -> bytes:
    return (resources.files("celery_ratchet.web") / "static" / name).read_bytes()


@cache
def environment() -> Any:
    if jinja2 is None:
        raise ConfigurationError(
            "the dashboard needs Jinja2: pip install 'celery-ratchet[web]' (Jinja2, and "
            "waitress to serve it)"
        )
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("celery_ratchet.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shown"] = shown
    env.filters["duration"] = duration
    env.globals["NAV"] = NAV
    env.globals["static_version"] = static_version
    return env


def render(name: str, context: Mapping[str, Any]) -> str:
    return str(environment().get_template(name).render(**context))


def markup(html: str) -> Any:
    """HTML made here (an SVG chart) that the templates insert as it is."""
    return Markup(html)
