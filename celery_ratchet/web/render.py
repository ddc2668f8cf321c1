"""HTML pieces of the dashboard. Every value from the database passes through :func:`esc`
(or :func:`cell`), so a row with ``<script>`` in its arguments shows as text."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import Enum
from typing import Any
from urllib.parse import urlencode

NAV = (
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/dlq", "Dead letters"),
    ("/schedules", "Schedules"),
    ("/batches", "Batches"),
    ("/resources", "Resources"),
    ("/nodes", "Nodes"),
)

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{background:#263238;padding:.5em 1em}header a{color:#eceff1;margin-right:1.2em}
header a.on{font-weight:bold;text-decoration:underline}main{padding:1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:left;vertical-align:top}th{background:#eceff1}pre{background:#f5f5f5;padding:.5em;
overflow:auto;max-height:30em}.bar{width:12em;height:1em;background:#eee;display:inline-block}
.bar span{display:block;height:100%;background:#43a047}.bar span.bad{background:#e53935}
.note{background:#fff8e1;border:1px solid #ffe082;padding:.4em .8em}form.inline{display:inline}
.ro{color:#777}
"""


def esc(value: Any) -> str:
    """``value`` as HTML text: nothing in it is markup."""
    if value is None:
        return ""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, datetime):
        value = value.isoformat(sep=" ", timespec="seconds")
    elif not isinstance(value, str):
        value = json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
    return html.escape(value, quote=True)


def link(path: str, text: Any, **query: Any) -> str:
    wanted = {k: v for k, v in query.items() if v not in (None, "")}
    href = path + ("?" + urlencode(wanted) if wanted else "")
    return f'<a href="{html.escape(href, quote=True)}">{esc(text)}</a>'


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A table whose cells are already HTML (made with :func:`esc` or :func:`link`)."""
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not rows:
        body = f'<tr><td colspan="{len(columns)}">none</td></tr>'
    return f"<table><tr>{head}</tr>{body}</table>"


def fields(values: Mapping[str, Any]) -> str:
    """Name/value rows, values escaped."""
    return table(["field", "value"], [[esc(k), esc(v)] for k, v in values.items()])


def bar(percent: float, *, bad: bool = False) -> str:
    shown = max(0.0, min(100.0, percent))
    cls = ' class="bad"' if bad else ""
    return (
        f'<span class="bar" role="progressbar" aria-valuenow="{shown:.0f}">'
        f'<span{cls} style="width:{shown:.1f}%"></span></span> {shown:.0f}%'
    )


def chart(values: Sequence[int], *, width: int = 600, height: int = 120) -> str:
    """Inline SVG bars, oldest first; hovering one shows its count."""
    top = max(values, default=0) or 1
    step = width / max(len(values), 1)
    bars = []
    for i, n in enumerate(values):
        h = round(n / top * (height - 14), 1)
        ago = len(values) - i
        bars.append(
            f'<rect x="{i * step:.1f}" y="{height - h:.1f}" width="{max(step - 1, 1):.1f}" '
            f'height="{h}" fill="#1e88e5"><title>{ago} min ago: {n}</title></rect>'
        )
    return (
        f'<svg class="chart" width="{width}" height="{height}" role="img" '
        f'aria-label="jobs finished per minute">'
        f'<text x="0" y="11" font-size="11">max {top}/min</text>{"".join(bars)}'
        f'<line x1="0" y1="{height}" x2="{width}" y2="{height}" stroke="#999"/></svg>'
    )


def button(
    action: str,
    label: str,
    csrf: str,
    values: Mapping[str, str],
    *,
    read_only: bool,
) -> str:
    """A POST form of one button carrying the CSRF token; nothing in read-only mode."""
    if read_only:
        return ""
    hidden = "".join(
        f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in values.items()
    )
    return (
        f'<form class="inline" method="post" action="{esc(action)}">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">{hidden}'
        f'<button type="submit">{esc(label)}</button></form>'
    )


def page(title: str, body: str, *, active: str, note: str | None, read_only: bool) -> str:
    nav = "".join(f'<a href="{p}"{" class=on" if p == active else ""}>{esc(t)}</a>' for p, t in NAV)
    mode = '<span class="ro">read-only</span>' if read_only else ""
    shown = f'<p class="note" role="status">{esc(note)}</p>' if note else ""
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>{esc(title)} · celery_ratchet</title><style>{_STYLE}</style></head>"
        f"<body><header>{nav}{mode}</header><main><h1>{esc(title)}</h1>{shown}{body}"
        "</main></body></html>"
    )
