"""Worker nodes: registration, heartbeats and the recovery of dead nodes' jobs."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import (
    and_,
    bindparam,
    delete,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection

from celery_ratchet.domain.job import (
    JobStatus,
    JobType,
)
from celery_ratchet.domain.recovery import OrphanRecovery as OrphanRecovery  # kept importable
from celery_ratchet.domain.recovery import recovery_limit_record
from celery_ratchet.store import dlq_alerts
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import (
    db_now,
    db_now_minus,
)
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.engine import (
    transaction,
)
from celery_ratchet.store.job_rows import (
    CLEARED_CLAIM,
    job,
)
from celery_ratchet.store.schema import (
    scheduler_node,
    scheduler_resource_permit,
)
from celery_ratchet.store.settle import Settle
from celery_ratchet.store.step_rows import (
    cancel_downstream,
    record_ended_parts,
)


class Nodes:
    """Worker nodes: registration, heartbeats and the recovery of dead nodes' jobs.
    ``settler``: where the jobs recovery gives up are counted as dead letters."""

    def __init__(self, db: Database, dialect: Dialect, settler: Settle) -> None:
        self.db = db
        self.dialect = dialect
        self.settler = settler

    # -- nodes ------------------------------------------------------------------------------

    def register_node(
        self,
        node_id: str,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        schedule_keys: Sequence[str] | None = None,
        task_names: Sequence[str] | None = None,
    ) -> datetime:
        """Register a node (again: a registration sent twice leaves one row); returns the
        moment it was registered, by the database clock (what it may have been asked to do
        is what was asked from then on). ``schedule_keys``: the schedules its configuration
        owns (see :meth:`node_schedule_keys`); ``task_names``: the tasks it has registered
        (see ``TaskHandoff.nodes_knowing``)."""
        n = scheduler_node

        def work(conn: Connection) -> datetime:
            with transaction(conn):
                now: datetime = conn.execute(select(db_now())).scalar_one()
                # A row of this id is this node's own: an earlier registration that committed
                # but whose reply was lost (node ids name one process and are never reused).
                conn.execute(delete(n).where(n.c.node_id == node_id))
                conn.execute(
                    insert(n).values(
                        node_id=node_id,
                        hostname=hostname,
                        pid=pid,
                        queues=",".join(queues),
                        concurrency=concurrency,
                        started_at=now,
                        heartbeat_ts=now,
                        schedule_keys=None
                        if schedule_keys is None
                        else json.dumps(sorted(schedule_keys)),
                        task_names=None if task_names is None else json.dumps(sorted(task_names)),
                    )
                )
                return now

        registered: datetime = self.db.run(work, "the node was not registered", liveness=True)
        return registered

    def heartbeat(self, node_id: str) -> bool:
        """Refresh the node's heartbeat; False when the row is gone (declared dead)."""
        n = scheduler_node
        stmt = update(n).where(n.c.node_id == node_id).values(heartbeat_ts=db_now())
        return self.db.run(
            lambda conn: conn.execute(stmt).rowcount == 1, "no heartbeat was written", liveness=True
        )

    def database_time(self) -> datetime | None:
        """The database's clock, now (UTC): what nodes measure their own clock against;
        None for SQLite, whose clock is this host's own (and reads in milliseconds)."""
        if self.dialect.clock_is_hosts:
            return None
        stmt = select(db_now())
        read: datetime = self.db.run(
            lambda conn: conn.execute(stmt).scalar_one(), "the database's time was not read"
        )
        return read

    def set_node_queues(self, node_id: str, queues: Sequence[str]) -> None:
        """Record the queues the node claims from (``add_consumer``, ``cancel_consumer``);
        the pending jobs handed to it in a queue it left are anyone's again."""
        n = scheduler_node
        stmt = update(n).where(n.c.node_id == node_id).values(queues=",".join(queues))
        handed = [job.c.status == JobStatus.PENDING.value, job.c.picked_by == node_id]
        if queues:
            handed.append(job.c.queue.not_in(list(queues)))
        released = update(job).where(*handed).values(picked_by=None)

        def work(conn: Connection) -> None:
            with transaction(conn):
                conn.execute(stmt)
                conn.execute(released)

        self.db.run(work, "the node's queues were not recorded")

    def remove_node(self, node_id: str) -> None:
        """Remove the node's row; the pending jobs handed to it are anyone's again."""
        n = scheduler_node

        def work(conn: Connection) -> None:
            with transaction(conn):
                conn.execute(delete(n).where(n.c.node_id == node_id))
                conn.execute(
                    update(job)
                    .where(job.c.status == JobStatus.PENDING.value, job.c.picked_by == node_id)
                    .values(picked_by=None)
                )

        self.db.run(work, "the node was not removed")

    def live_node_queues(self, grace_seconds: float) -> dict[str, list[str]]:
        """The queues of every node whose heartbeat is younger than ``grace_seconds`` by
        the database clock."""
        n = scheduler_node
        stmt = select(n.c.node_id, n.c.queues).where(
            n.c.heartbeat_ts >= db_now_minus(grace_seconds)
        )
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "nodes were not read")
        return {r.node_id: [q for q in r.queues.split(",") if q] for r in rows}

    def node_heartbeats(self) -> dict[str, datetime]:
        """The last heartbeat of every registered node (by the database clock)."""
        n = scheduler_node
        stmt = select(n.c.node_id, n.c.heartbeat_ts)
        rows = self.db.run(
            lambda conn: conn.execute(stmt).all(), "heartbeats were not read", liveness=True
        )
        return {r.node_id: r.heartbeat_ts for r in rows}

    def node_schedule_keys(self) -> dict[str, list[str] | None]:
        """Per registered node, the business keys of the schedules its configuration owns;
        None for a node that did not say (one of an earlier version)."""
        n = scheduler_node
        stmt = select(n.c.node_id, n.c.schedule_keys)
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "nodes were not read")
        return {r.node_id: _keys(r.schedule_keys) for r in rows}

    def recover_orphans(
        self,
        grace_seconds: float,
        *,
        observed: Mapping[str, datetime] | None = None,
        max_recoveries: int | None = None,
    ) -> OrphanRecovery:
        """Take the RUNNING jobs of dead nodes back, release their permits and delete the
        dead nodes, atomically.

        ``observed``: the nodes the caller watched stay silent for a full grace period, each
        with the heartbeat it saw; a node counts as dead only if its heartbeat still has that
        value (it did not beat since) and is older than ``grace_seconds`` by the database
        clock. Without it, every node silent for ``grace_seconds`` by the database clock is
        dead: only right for a caller that knows no node was cut off from the database.

        Jobs owned by no registered node (a node row removed by hand, a node that died while
        registering, a forged row with no owner) count as orphaned once their claim is older
        than the grace period, or has no time at all.

        A job a dead node held after more than ``max_recoveries`` claims since it was last
        scheduled (``claims``; hand-backs of live nodes count too) is not run again: it is
        FAILED, in the dead-letter queue, with an error that says so. The others (and every
        recurring master) are PENDING again.
        """
        n, p = scheduler_node, scheduler_resource_permit
        cutoff = db_now_minus(grace_seconds)
        silent = select(n.c.node_id, n.c.heartbeat_ts).where(n.c.heartbeat_ts < cutoff)
        if observed is not None:
            silent = silent.where(n.c.node_id.in_(list(observed)))
        if self.dialect.locks_rows:
            silent = silent.with_for_update(skip_locked=True)
        owned_by = job.c.picked_by.in_(bindparam("dead", expanding=True))
        unowned = and_(
            or_(job.c.picked_by.is_(None), job.c.picked_by.not_in(select(n.c.node_id))),
            or_(job.c.claimed_at.is_(None), job.c.claimed_at < cutoff),
        )

        def work(conn: Connection) -> OrphanRecovery:
            with transaction(conn):
                if observed is not None and not observed:
                    dead: list[str] = []
                else:
                    dead = [
                        r.node_id
                        for r in conn.execute(silent)
                        if observed is None or observed.get(r.node_id) == r.heartbeat_ts
                    ]
                running = job.c.status == JobStatus.RUNNING.value
                where = and_(running, or_(owned_by, unowned) if dead else unowned)
                params = {"dead": dead} if dead else {}
                found = select(job.c.job_id, job.c.claims, job.c.job_type, job.c.queue).where(where)
                if self.dialect.locks_rows:  # (SQLite: the transaction holds the write lock)
                    # Locked as read: a settle racing this recovery waits for it, then finds
                    # the claim gone; the downstream effects below match the rows changed.
                    found = found.with_for_update()
                given_up = defaultdict(list)
                requeued = []
                queues: set[str] = set()
                for r in conn.execute(found, params):
                    # A recurring master is claimed at every fire time, and its firing is
                    # ratchet's own: its schedule is never given up.
                    master = r.job_type == JobType.RECURRING.value
                    if max_recoveries is not None and r.claims > max_recoveries and not master:
                        given_up[r.claims].append(r.job_id)
                    else:
                        requeued.append(r.job_id)
                        queues.add(r.queue)
                if requeued:
                    conn.execute(
                        update(job)
                        .where(where, job.c.job_id.in_(requeued))
                        .values(status=JobStatus.PENDING.value, **CLEARED_CLAIM),
                        params,
                    )
                    # Idle nodes of those queues sleep until told: they are, at commit.
                    for queue in sorted(queues):
                        self.db.announce_in(conn, queue)
                dead_lettered = []
                for claims, ids in given_up.items():
                    error = recovery_limit_record(claims, max_recoveries or 0)
                    conn.execute(
                        update(job)
                        .where(where, job.c.job_id.in_(ids))
                        .values(
                            status=JobStatus.FAILED.value,
                            finished_at=db_now(),
                            last_error=error,
                            error_traceback=None,
                        ),
                        params,
                    )
                    cancel_downstream(conn, ids, error)
                    record_ended_parts(conn, ids, "FAILURE")
                    dead_lettered += ids
                if dead_lettered:
                    self.settler.count_dead_letters(
                        conn, dlq_alerts.dead_letters_by_id(conn, dead_lettered)
                    )
                orphans = requeued + dead_lettered
                if orphans:
                    conn.execute(delete(p).where(p.c.job_id.in_(orphans)))
                if dead:
                    conn.execute(delete(p).where(p.c.node_id.in_(dead)))
                    conn.execute(delete(n).where(n.c.node_id.in_(dead)))
                # Pending jobs handed to a node no longer registered (dead, or its row gone
                # otherwise) are anyone's again: few, found through the (status, picked_by)
                # index.
                conn.execute(
                    update(job)
                    .where(
                        job.c.status == JobStatus.PENDING.value,
                        job.c.picked_by.is_not(None),
                        job.c.picked_by.not_in(select(n.c.node_id)),
                    )
                    .values(picked_by=None)
                )
                return OrphanRecovery(
                    sorted(requeued), sorted(dead_lettered), sorted(dead), sorted(queues)
                )

        return self.db.run(work, "orphaned jobs were not recovered")


def _keys(stored: str | None) -> list[str] | None:
    if stored is None:
        return None
    try:
        found = json.loads(stored)
    except ValueError:
        return None  # unreadable: as a node that did not say
    return [str(k) for k in found] if isinstance(found, list) else None
