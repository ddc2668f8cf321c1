"""A claimed job of a task the claiming node does not know, handed to a node that knows it.

During a rolling or canary deploy a node of the release before claims jobs of a task only
the newer release registers. Each node says at registration which tasks it has
(``scheduler_node.task_names``); the node that cannot run the job finds a live node whose
list has the task and serves the job's queue (:meth:`TaskHandoff.nodes_knowing`), and puts
the job back PENDING with that node in ``picked_by`` (:meth:`TaskHandoff.hand_to`). The
claim statement (``store/claim_sql.py``) leaves such a row to that node alone, so a node of the
release before cannot win it again. The claim it was handed from is not counted in
``claims`` (as a deferral's is not): ``claims`` counts claims that never finished, which
``ratchet_max_recoveries`` bounds, and a hand-over finished. The mark lapses when that
node is removed or declared dead (``Nodes.remove_node``, ``Nodes.recover_orphans``): the
job is anyone's again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.engine import Connection

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.database import Database
from celery_ratchet.store.db_clock import db_now_minus
from celery_ratchet.store.engine import transaction
from celery_ratchet.store.job_rows import claim_held, job
from celery_ratchet.store.schema import scheduler_node, scheduler_resource_permit


class TaskHandoff:
    """Jobs of tasks a node does not know, handed to live nodes that do."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def nodes_knowing(
        self, task_name: str, queue: str, grace_seconds: float, *, excluding: str | None = None
    ) -> list[str]:
        """The nodes, sorted, whose heartbeat is younger than ``grace_seconds`` by the
        database clock, that serve ``queue`` and said they have ``task_name`` registered;
        ``excluding`` (the asking node) left out. A node that said nothing (one of an
        earlier version) is never among them."""
        n = scheduler_node
        stmt = select(n.c.node_id, n.c.queues, n.c.task_names).where(
            n.c.heartbeat_ts >= db_now_minus(grace_seconds), n.c.task_names.is_not(None)
        )
        rows = self.db.run(lambda conn: conn.execute(stmt).all(), "nodes were not read")
        return sorted(
            r.node_id
            for r in rows
            if r.node_id != excluding
            and queue in r.queues.split(",")
            and task_name in _names(r.task_names)
        )

    def hand_to(self, handoffs: Sequence[tuple[str, str, str]]) -> int:
        """Give claimed jobs back, each as (job id, claim token, node id), PENDING and due as
        they were, for that node alone to claim; their permits are released. Returns how
        many claims were still held (a lost claim hands nothing)."""
        if not handoffs:
            return 0
        permit = scheduler_resource_permit
        back = (
            update(job)
            .where(*claim_held(bindparam("p_job_id"), bindparam("p_token")))
            .values(
                status=JobStatus.PENDING.value,
                picked_by=bindparam("p_node"),
                claims=job.c.claims - 1,
                claim_token=None,
                claimed_at=None,
                started_at=None,
            )
        )
        release = delete(permit).where(
            permit.c.job_id == bindparam("p_job_id"), permit.c.claim_token == bindparam("p_token")
        )
        params = [{"p_job_id": j, "p_token": t, "p_node": n} for j, t, n in handoffs]

        def work(conn: Connection) -> int:
            with transaction(conn):
                changed = conn.execute(back, params).rowcount
                conn.execute(release, [{"p_job_id": j, "p_token": t} for j, t, _ in handoffs])
                self.db.announce_queues_of(conn, [j for j, _, _ in handoffs])
            return int(changed)

        return self.db.run(work, "no job was handed to another node")


def _names(stored: str | None) -> list[str]:
    if stored is None:
        return []
    try:
        found = json.loads(stored)
    except ValueError:
        return []  # unreadable: as a node that did not say
    return [str(k) for k in found] if isinstance(found, list) else []
