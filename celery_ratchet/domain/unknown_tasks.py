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

All that is for a task no live node knows. While one does (nodes say which tasks they have
when they register), a job is handed to such a node at once, for it alone to claim, and no
grace period runs toward failing it (:meth:`UnknownTasks.decide`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

#: A job handed back is due again this much later the first time: another node claims it
#: meanwhile, and this one, finding it again, does not spin on it. Twice as long each time
#: this node refuses it again, up to the most.
HAND_BACK_DELAY_SECONDS = 5.0
HAND_BACK_DELAY_MAX_SECONDS = 60.0
#: How long a node goes by what it read of the live nodes that know a task before reading
#: again: one read per task and queue for a claimed batch, not one per job.
KNOWING_FRESH_SECONDS = 5.0


@dataclass(frozen=True)
class HandTo:
    """Hand the job to ``node`` (a live node that knows its task), due at once."""

    node: str


@dataclass(frozen=True)
class HandBack:
    """Hand the job back for anyone, due ``seconds`` from now."""

    seconds: float


#: What to do with a job of a task unknown here; None: fail it as not registered now.
Decision = HandTo | HandBack | None


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
    _named_handed: set[str] = field(default_factory=set)
    _knowing: dict[tuple[str, str], tuple[float, list[str]]] = field(default_factory=dict)
    _pruned_at: float | None = None

    def decide(self, job_id: str, knowing: Sequence[str], now: float) -> Decision:
        """What to do with a job of a task unknown here, given the live nodes that know it
        (``knowing``): hand it to one of them, spread by job id, and forget any refusal of
        it (no grace runs while a node knows the task); when there is none, hand it back
        for a while (:meth:`hand_back`), or fail it."""
        if knowing:
            self._refused.pop(job_id, None)
            nodes = sorted(knowing)
            return HandTo(nodes[zlib.crc32(job_id.encode()) % len(nodes)])
        seconds = self.hand_back(job_id, now)
        return None if seconds is None else HandBack(seconds)

    def knowing(self, task_name: str, queue: str, now: float) -> list[str] | None:
        """The live nodes read as knowing ``task_name`` (serving ``queue``) less than
        ``KNOWING_FRESH_SECONDS`` ago; None: to be read again (:meth:`remember`)."""
        found = self._knowing.get((task_name, queue))
        if found is None or now - found[0] >= KNOWING_FRESH_SECONDS:
            return None
        return found[1]

    def remember(self, task_name: str, queue: str, nodes: Sequence[str], now: float) -> None:
        self._knowing[task_name, queue] = (now, list(nodes))

    def first_handed(self, task_name: str) -> bool:
        """Whether this is the first job of ``task_name`` this node hands to another node
        (to say so once)."""
        if task_name in self._named_handed:
            return False
        self._named_handed.add(task_name)
        return True

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
