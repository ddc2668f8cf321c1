"""Jobs of a task this node does not know, as during a rolling deploy a node of the release
before meets the jobs of a task the next release added: each is handed back, for nodes that
know the task, for a bounded time from the first time this node refused it, then failed as
not registered. Pure: ``now`` (seconds, monotonic) is passed in.

A refusal is remembered by the node that made it (a job bounced between two nodes that both
lack the task ends once either has refused it for the whole grace period): bounded, with no
column to write and nothing to clean up in the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: A job handed back is due again this much later: another node claims it meanwhile, and
#: this one, finding it again, does not spin on it.
HAND_BACK_DELAY_SECONDS = 5.0


@dataclass
class UnknownTasks:
    """``grace_seconds``: how long a job of an unknown task is handed back, from this
    node's first refusal of it; 0 fails it at once."""

    grace_seconds: float
    _first_refused: dict[str, float] = field(default_factory=dict)
    _named: set[str] = field(default_factory=set)
    _pruned_at: float | None = None

    def hand_back(self, job_id: str, now: float) -> bool:
        """Whether to hand the job back (True) or to fail it now (False)."""
        self._prune(now)
        first = self._first_refused.setdefault(job_id, now)
        if now - first < self.grace_seconds:
            return True
        del self._first_refused[job_id]
        return False

    def first_of(self, task_name: str) -> bool:
        """Whether this is the first job of ``task_name`` this node refused (to say so once)."""
        if task_name in self._named:
            return False
        self._named.add(task_name)
        return True

    def _prune(self, now: float) -> None:
        """Forget the jobs refused longer ago than the grace period and not seen since:
        another node ran them."""
        if self._pruned_at is not None and now - self._pruned_at < self.grace_seconds:
            return
        self._pruned_at = now
        keep = 2 * self.grace_seconds + HAND_BACK_DELAY_SECONDS
        self._first_refused = {j: t for j, t in self._first_refused.items() if now - t < keep}
