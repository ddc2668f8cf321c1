"""A node's clock against the database's: how far off it is, and when that is worth saying."""

from __future__ import annotations

from datetime import datetime


def offset_seconds(sent: datetime, db_time: datetime) -> float:
    """How far the database's clock is ahead of this node's (negative: behind), from a read
    of the database's time sent at ``sent`` by the node's clock. The database read its clock
    after that, so this is the largest offset the read allows: a time reckoned with it is
    never earlier than the database's, and later by at most the round trip."""
    return (db_time - sent).total_seconds()


def skew_to_report(offset: float, bound: float, reported: float | None) -> bool:
    """Whether an offset of ``offset`` seconds is worth a warning when ``reported`` was the
    last one warned about (None: none yet, or the clock came back within ``bound``): one
    beyond ``bound`` is, once, and again when it moved by more than half the bound since."""
    if bound <= 0 or abs(offset) <= bound:
        return False
    return reported is None or abs(offset - reported) > bound / 2
