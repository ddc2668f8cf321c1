"""``celery beat`` left running on a ratchet app: it is stopped before its first tick.

A ratchet app's workers register its ``beat_schedule`` and fire each tick once across nodes.
A beat process forgotten in a switch (its service unit, a worker's ``-B``) would send every
tick of those entries a second time, into the same store. So a beat whose app has
``beat_schedule`` entries exits at start, before it sends anything, saying why and what to do.
A beat with no such entries runs: a scheduler with entries of its own (django-celery-beat's
database scheduler, say) is then the only one firing them.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from celery_ratchet.celery.state import is_installed, is_ratchet_app

logger = logging.getLogger(__name__)

#: The exit status of a beat refused here (sysexits' EX_CONFIG: a configuration error).
EXIT_STATUS = 78


class BeatNotNeeded(SystemExit):
    """``celery beat`` on a ratchet app whose workers fire its ``beat_schedule``. A
    ``SystemExit``: raised from Celery's ``beat_init`` signal, the only exception that stops
    the beat service there (the signal logs and swallows any other)."""


def connect() -> None:
    """Once per process: the signal keeps one receiver per dispatch_uid."""
    signals.beat_init.connect(_on_beat_init, weak=False, dispatch_uid="celery_ratchet.beat")


def _on_beat_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None or not (is_installed(app) or is_ratchet_app(app)):
        return
    refuse_beat(dict(app.conf.beat_schedule or {}))


def refuse_beat(beat_schedule: dict[str, Any]) -> None:
    """Stop a beat that would fire ``beat_schedule`` beside the workers."""
    if not beat_schedule:
        return
    names = sorted(beat_schedule)
    shown = ", ".join(repr(n) for n in names[:5]) + (
        f" and {len(names) - 5} more" if len(names) > 5 else ""
    )
    message = (
        f"celery beat is not needed on a ratchet app: its workers fire the "
        f"{len(names)} beat_schedule entries ({shown}) themselves, each tick once across "
        "nodes, and this beat would send every tick a second time. Stop the beat service "
        "(and drop -B from worker command lines); beat exits without sending anything"
    )
    logger.critical("ratchet: %s", message)
    raise BeatNotNeeded(EXIT_STATUS)
