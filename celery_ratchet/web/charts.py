"""Charts drawn on the server as SVG: bars of counts per span of time (stacked by outcome)
and a line of durations. Nothing to load in the browser; each bar has a ``<title>`` (shown
on hover) and a ``data-`` attribute with its values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

#: Outcome, colour: the order bars are stacked in, bottom up.
OUTCOMES = (("succeeded", "#43a047"), ("failed", "#e53935"), ("revoked", "#9e9e9e"))
WIDTH, HEIGHT, TOP = 720, 140, 16


@dataclass(frozen=True)
class Span:
    label: str  # when the span ended, as shown on hover
    values: dict[str, float | None]


def _frame(label: str, body: str, *, top_label: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{escape(label)}">'
        f'<text x="0" y="11" font-size="11">{escape(top_label)}</text>{body}'
        f'<line x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}" stroke="#999"/></svg>'
    )


def stacked_bars(
    spans: Sequence[Span],
    *,
    label: str,
    unit: str,
    series: Sequence[tuple[str, str]] = OUTCOMES,
) -> str:
    """Bars of ``series`` (by default succeeded / failed / revoked) per span, stacked,
    oldest first."""
    top = max((sum(int(s.values.get(n) or 0) for n, _ in series) for s in spans), default=0) or 1
    step = WIDTH / max(len(spans), 1)
    bars = []
    for i, span in enumerate(spans):
        floor = float(HEIGHT)
        counts = {name: int(span.values.get(name) or 0) for name, _ in series}
        title = f"{span.label}: " + ", ".join(f"{n} {name}" for name, n in counts.items())
        data = " ".join(f'data-{name}="{n}"' for name, n in counts.items())
        rects = []
        for name, colour in series:
            height = round(counts[name] / top * (HEIGHT - TOP), 1)
            if height <= 0:
                continue
            floor -= height
            rects.append(
                f'<rect x="{i * step:.1f}" y="{floor:.1f}" width="{max(step - 1, 1):.1f}" '
                f'height="{height}" fill="{colour}"/>'
            )
        bars.append(
            f'<g class="bar" {data}><title>{escape(title)}</title>'
            f'<rect x="{i * step:.1f}" y="{TOP}" width="{max(step - 1, 1):.1f}" '
            f'height="{HEIGHT - TOP}" fill="transparent"/>{"".join(rects)}</g>'
        )
    return _frame(label, "".join(bars), top_label=f"max {top} {unit}")


def line(spans: Sequence[Span], names: Sequence[tuple[str, str]], *, label: str, unit: str) -> str:
    """One polyline per ``(value name, colour)``, with a dot per span that has a value."""
    values = [v for s in spans for name, _ in names if (v := s.values.get(name)) is not None]
    top = max(values, default=0.0) or 1.0
    step = WIDTH / max(len(spans), 1)
    body = []
    for name, colour in names:
        points = []
        for i, span in enumerate(spans):
            value = span.values.get(name)
            if value is None:
                continue
            x = i * step + step / 2
            y = HEIGHT - value / top * (HEIGHT - TOP)
            points.append((x, y, value, span.label))
        if points:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in points)
            body.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
            )
        body += [
            f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}" '
            f'data-{name}="{value:.3f}"><title>{escape(at)}: {name} {value:.3f} {unit}</title>'
            "</circle>"
            for x, y, value, at in points
        ]
    return _frame(label, "".join(body), top_label=f"max {top:.3g} {unit}")


def bars(counts: Sequence[int], labels: Sequence[str], *, label: str, unit: str) -> str:
    """Plain bars, oldest first (jobs finished per minute)."""
    spans = [Span(at, {"finished": n}) for n, at in zip(counts, labels, strict=True)]
    return stacked_bars(spans, label=label, unit=unit, series=(("finished", "#1e88e5"),))
