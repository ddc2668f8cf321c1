"""Which other nodes are dead, as one node can tell from what it saw itself.

A heartbeat's age by the database clock says nothing after the database was away: nobody
could write one, so every node looks silent the moment it returns. A node is therefore judged
by a heartbeat that did not *advance* while this node watched it, for a full grace period of
its own clock, all that time in contact with the database. A node that lost contact itself
forgets what it saw and watches a full grace period again before it judges anyone.

Pure: the caller passes the heartbeats it read and its own monotonic ``now``, and serialises
the calls.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

H = TypeVar("H", bound=Hashable)


class LivenessJudge(Generic[H]):
    """Heartbeat values seen per node, and since when each has not changed."""

    def __init__(self, grace_seconds: float, own_node: str) -> None:
        self.grace = grace_seconds
        self.own_node = own_node
        #: node → (heartbeat value, when this node first saw that value)
        self._seen: dict[str, tuple[H, float]] = {}
        #: Since when this node has been in contact with the database without a break.
        self._in_contact_since: float | None = None

    def lost_contact(self) -> None:
        """This node could not reach the database: what it saw before proves nothing."""
        self._seen.clear()
        self._in_contact_since = None

    def observe(self, heartbeats: Mapping[str, H], now: float) -> None:
        """The heartbeat of every registered node, just read from the database."""
        if self._in_contact_since is None:
            self._in_contact_since = now
        seen: dict[str, tuple[H, float]] = {}
        for node, value in heartbeats.items():
            before = self._seen.get(node)
            seen[node] = before if before is not None and before[0] == value else (value, now)
        self._seen = seen

    def may_judge(self, now: float) -> bool:
        """In contact for a full grace period: long enough to have seen a live node beat."""
        since = self._in_contact_since
        return since is not None and now - since >= self.grace

    def silent(self, now: float) -> dict[str, H]:
        """Nodes whose heartbeat has not moved for a full grace period while this node
        watched, each with the value seen: the store recovers a node only if its heartbeat
        still has that value (it did not beat since)."""
        if not self.may_judge(now):
            return {}
        return {
            node: value
            for node, (value, since) in self._seen.items()
            if node != self.own_node and now - since >= self.grace
        }
