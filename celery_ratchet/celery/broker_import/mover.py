"""Moving what a broker holds into the job store, exactly once.

A source (:mod:`.redis_source`, :mod:`.amqp_source`) hands over messages a batch at a time,
each with a handle; the mover converts them, writes the batch's jobs in one transaction
(a job id the store holds already is left alone: moved by a run that was cut off before it
took the message out of the broker) and only then tells the source to take the batch out of
the broker, and to give the refused ones back. A run cut off anywhere loses and doubles
nothing: what was not taken out is moved, or found present, by the next run.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery import Celery

from celery_ratchet.celery.broker_import.convert import (
    BrokerMessage,
    ChordMark,
    Converter,
    Decode,
    Moved,
    Refused,
)
from celery_ratchet.celery.canvas.batches import encode_signature
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.batch import BatchKind, NewBatch
from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import RatchetError


@dataclass(frozen=True)
class Item:
    """A message taken from the broker (or read, in a dry run) and where to give it back."""

    handle: Any
    queue: str
    message: BrokerMessage | Refused


class Source(Protocol):
    def batches(self, size: int, dry_run: bool) -> Iterator[list[Item]]:
        """The messages of the queues, a batch at a time; in a dry run only read."""
        ...

    def settle(self, batch: Sequence[Item], refused: Sequence[Item]) -> None:
        """The batch's jobs are committed: take it out of the broker, but give ``refused``
        back."""
        ...

    def chord_members(self, decode: Decode) -> dict[str, int] | None:
        """Per chord id, how many of its header's messages the queues hold; None when the
        source cannot tell before taking them. ``decode``: how a message is read."""
        ...


@dataclass
class QueueCounts:
    moved: int = 0
    present: int = 0
    refused: int = 0


@dataclass
class Summary:
    """What a run did, per queue; refusals by reason, with a few of their task ids."""

    queues: dict[str, QueueCounts] = field(default_factory=dict)
    reasons: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def of(self, queue: str) -> QueueCounts:
        return self.queues.setdefault(queue, QueueCounts())

    def refuse(self, queue: str, refusal: Refused) -> None:
        self.of(queue).refused += 1
        key = (queue, refusal.reason)
        self.reasons[key] += 1
        if refusal.task_id is not None and len(self.examples.setdefault(key, [])) < 3:
            self.examples[key].append(refusal.task_id)

    @property
    def handled(self) -> int:
        return sum(c.moved + c.present + c.refused for c in self.queues.values())


_OTHER_CONTENT = (
    "the store holds a job of this task id with another task or other arguments (a task id "
    "sent twice?): it is not that message moved before, so it stays in the broker; let a "
    "Celery worker run it, or send it again under a new id"
)

#: Messages converted and written per transaction.
BATCH_SIZE = 500


class Mover:
    def __init__(
        self,
        app: Celery,
        source: Source,
        *,
        dry_run: bool = False,
        batch_size: int = BATCH_SIZE,
        on_progress: Callable[[Summary], None] | None = None,
        chord_states: Any = None,
    ) -> None:
        self.app = app
        self.source = source
        self.dry_run = dry_run
        self.batch_size = batch_size
        self.on_progress = on_progress or (lambda summary: None)
        self.converter = Converter(app)
        self.state = ratchet_state(app)
        self.summary = Summary()
        self._chords_opened: set[str] = set()
        #: Where the chords' sizes are read (the old result backend), and what was read.
        self.chord_states = chord_states
        self._chords: dict[str, Moved | Refused] = {}

    def run(self) -> Summary:
        members = self.source.chord_members(self.converter.decode)
        for batch in self.source.batches(self.batch_size, self.dry_run):
            self._move(batch, members)
            self.on_progress(self.summary)
        return self.summary

    def _move(self, batch: list[Item], members: dict[str, int] | None) -> None:
        moved: list[tuple[Item, Moved]] = []
        refused: list[Item] = []
        for item in batch:
            message = item.message
            outcome = (
                self.converter.convert(message) if isinstance(message, BrokerMessage) else message
            )
            if isinstance(outcome, Moved) and outcome.chord is not None:
                outcome = self._whole_chord(outcome, outcome.chord, members)
            if isinstance(outcome, Refused):
                refused.append(item)
                self.summary.refuse(item.queue, outcome)
            else:
                moved.append((item, outcome))
        present = self._write(moved, refused)
        stored = self.state.store.stored_contents(sorted(present)) if present else {}
        for item, done in moved:
            counts = self.summary.of(item.queue)
            job = done.job
            if job.job_id in present:
                if stored.get(job.job_id, (job.task_name, job.message.payload)) == (
                    job.task_name,
                    job.message.payload,
                ):
                    counts.present += 1
                    continue
                # Not this message moved before: another task sent under the same id. Taking
                # it out of the broker would drop it.
                refused.append(item)
                self.summary.refuse(item.queue, Refused(_OTHER_CONTENT, job.job_id))
            elif not any(r is item for r in refused):
                counts.moved += 1
        if not self.dry_run:
            self.source.settle(batch, refused)

    def _write(self, moved: list[tuple[Item, Moved]], refused: list[Item]) -> set[str]:
        """Write the jobs; the ids the store held already. A batch the store refuses is
        written job by job, so that one bad message is refused alone."""
        jobs = [(m.job, m.steps) for _, m in moved]
        if self.dry_run:
            return set(self.state.store.stored_contents([j.job_id for j, _ in jobs]))
        self._open_chords([m.chord for _, m in moved if m.chord is not None])
        self._open_groups([m.job for _, m in moved])
        try:
            return self.state.store.import_jobs(jobs)
        except (RatchetError, ValueError) as exc:
            if len(jobs) == 1:
                item, _ = moved[0]
                refused.append(item)
                self.summary.refuse(item.queue, Refused(str(exc), jobs[0][0].job_id))
                return set()
        present: set[str] = set()
        for one in moved:
            present |= self._write([one], refused)
        return present

    def _open_chords(self, chords: list[ChordMark]) -> None:
        """The chord of moved header tasks: a batch that counts them and sends the body once
        the last one ends, as a chord sent to the store has. One a run made before is kept
        (with the members it counted)."""
        for chord in chords:
            if chord.group_id in self._chords_opened:
                continue
            body = encode_signature(chord.body)
            self.state.batches.open(
                NewBatch(chord.group_id, BatchKind.CHORD, chord.size, on_success=body)
            )
            self._chords_opened.add(chord.group_id)

    def _whole_chord(
        self, moved: Moved, chord: ChordMark, members: dict[str, int] | None
    ) -> Moved | Refused:
        """A chord's header task is moved only with the whole header, none of which ran: the
        body needs every member's result, and one that ran left its result with the old
        result backend, where the store's chord cannot count it. Celery keeps the chord's
        size in that backend too (not in the messages)."""
        if members is None:
            return Refused(
                f"a task of chord {chord.group_id}: chords are moved from Redis brokers only "
                "(whether the queues hold its whole header cannot be told before taking it); "
                "let a Celery worker on the broker finish it",
                moved.job.job_id,
            )
        size, returned = chord.size, 0
        if self.chord_states is not None:
            state = self.chord_states.of(chord.group_id)
            size, returned = size or state.size, state.returned
        found = (members or {}).get(chord.group_id, 0)
        where = f"a task of chord {chord.group_id}"
        if size is None:
            return Refused(
                f"{where}, whose size the old result backend keeps: pass --result-backend "
                "with its URL (a Redis result backend)",
                moved.job.job_id,
            )
        if returned or found < size:
            return Refused(
                f"{where}, of whose {size} header tasks {returned} returned to the old result "
                f"backend and the queues hold {found}: its body cannot be sent from the store; "
                "let a Celery worker on the broker finish it",
                moved.job.job_id,
            )
        return Moved(moved.job, moved.steps, ChordMark(chord.group_id, size, chord.body))

    def _open_groups(self, jobs: list[NewJob]) -> None:
        groups = [j.group_id for j in jobs if j.group_id is not None]
        if groups:  # listed by `ratchet batches`, as the groups a send writes
            self.state.batches.open_groups(groups)
