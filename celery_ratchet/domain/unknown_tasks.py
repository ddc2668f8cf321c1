"""Jobs of a task this node does not know, as during a rolling deploy a node of the release
before meets the jobs of a task the next release added: each is handed back, for nodes that
know the task, for a bounded time from the first time this node refused it, then failed as
not registered. Pure: ``now`` (seconds, monotonic) is passed in.

A refusal is remembered by the node that made it (a job bounced between two nodes that both
lack the task ends once either has refused it for the whole grace period): bounded, with no
column to write and nothing to clean up in the store. Each job is handed back for longer
each time this node refuses it again: a backlog of a task no node knows (a task removed, a
misspelt name) costs the database a claim and a hand-back per job every minute at most,
not every few seconds for the whole grace period.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: A job handed back is due again this much later the first time: another node claims it
#: meanwhile, and this one, finding it again, does not spin on it. Twice as long each time
#: this node refuses it again, up to the most.
HAND_BACK_DELAY_SECONDS = 5.0
HAND_BACK_DELAY_MAX_SECONDS = 60.0


@dataclass
class _Refused:
    first: float
    times: int = 0


@dataclass
class UnknownTasks:
    """``grace_seconds``: how long a job of an unknown task is handed back, from this
    node's first refusal of it; 0 fails it at once."""

    grace_seconds: float
    _refused: dict[str, _Refused] = field(default_factory=dict)
    _named: set[str] = field(default_factory=set)
    _pruned_at: float | None = None

    def hand_back(self, job_id: str, now: float) -> float | None:
        """For how many seconds to hand the job back; None: fail it now."""
        self._prune(now)
        refused = self._refused.setdefault(job_id, _Refused(now))
        if now - refused.first >= self.grace_seconds:
            del self._refused[job_id]
            return None
        delay = HAND_BACK_DELAY_SECONDS * float(2 ** min(refused.times, 16))
        refused.times += 1
        return min(delay, HAND_BACK_DELAY_MAX_SECONDS)

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
        keep = 2 * self.grace_seconds + HAND_BACK_DELAY_MAX_SECONDS
        self._refused = {j: r for j, r in self._refused.items() if now - r.first < keep}
