"""The in-memory store's worker nodes: registration, heartbeats, and the recovery of the
jobs of nodes declared dead."""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from celery_ratchet.domain.job import (
    JobType,
)
from celery_ratchet.domain.recovery import OrphanRecovery, recovery_limit_record
from celery_ratchet.store.memory.rows import (
    FAILED,
    PENDING,
    RUNNING,
    JobRow,
    NodeRow,
)
from celery_ratchet.store.memory.state import MemoryState


class NodeRows:
    """Worker nodes: registration, heartbeats, and recovery of dead ones' jobs."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state

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
        with self.state.lock:
            now = self.state.now()
            keys = None if schedule_keys is None else sorted(schedule_keys)
            names = None if task_names is None else sorted(task_names)
            self.state.t.nodes[node_id] = NodeRow(
                node_id, hostname, pid, ",".join(queues), concurrency, now, now, keys, names
            )
            return now

    def nodes_knowing(
        self, task_name: str, queue: str, grace_seconds: float, *, excluding: str | None = None
    ) -> list[str]:
        """As ``TaskHandoff.nodes_knowing``: live nodes serving ``queue`` that said they
        have ``task_name``."""
        with self.state.lock:
            cutoff = self.state.now() - timedelta(seconds=grace_seconds)
            return sorted(
                n.node_id
                for n in self.state.t.nodes.values()
                if n.heartbeat_ts >= cutoff
                and n.node_id != excluding
                and n.task_names is not None
                and task_name in n.task_names
                and queue in n.queues.split(",")
            )

    def node_schedule_keys(self) -> dict[str, list[str] | None]:
        with self.state.lock:
            return {n.node_id: copy.copy(n.schedule_keys) for n in self.state.t.nodes.values()}

    def heartbeat(self, node_id: str) -> bool:
        with self.state.lock:
            node = self.state.t.nodes.get(node_id)
            if node is None:
                return False
            node.heartbeat_ts = self.state.now()
            return True

    def database_time(self) -> datetime | None:
        """This store's clock: what a node measures its own against."""
        return self.state.now()

    def set_node_queues(self, node_id: str, queues: Sequence[str]) -> None:
        with self.state.lock:
            node = self.state.t.nodes.get(node_id)
            if node is not None:
                node.queues = ",".join(queues)
            for r in self.state.rows():  # handed to it in a queue it left: anyone's again
                if r.status == PENDING and r.picked_by == node_id and r.queue not in queues:
                    r.picked_by = None

    def remove_node(self, node_id: str) -> None:
        with self.state.lock:
            self.state.t.nodes.pop(node_id, None)
            for r in self.state.rows():  # the pending jobs handed to it: anyone's again
                if r.status == PENDING and r.picked_by == node_id:
                    r.picked_by = None

    def node_heartbeats(self) -> dict[str, datetime]:
        with self.state.lock:
            return {n.node_id: n.heartbeat_ts for n in self.state.t.nodes.values()}

    def live_node_queues(self, grace_seconds: float) -> dict[str, list[str]]:
        with self.state.lock:
            cutoff = self.state.now() - timedelta(seconds=grace_seconds)
            return {
                n.node_id: [q for q in n.queues.split(",") if q]
                for n in self.state.t.nodes.values()
                if n.heartbeat_ts >= cutoff
            }

    def list_nodes(self) -> list[dict[str, Any]]:
        with self.state.lock:
            running: dict[str | None, int] = defaultdict(int)
            for r in self.state.rows():
                if r.status == RUNNING:
                    running[r.picked_by] += 1
            nodes = sorted(self.state.t.nodes.values(), key=lambda n: n.started_at)
            return [
                {
                    "node_id": n.node_id,
                    "hostname": n.hostname,
                    "pid": n.pid,
                    "queues": n.queues,
                    "concurrency": n.concurrency,
                    "started_at": n.started_at,
                    "heartbeat_ts": n.heartbeat_ts,
                    "schedule_keys": n.schedule_keys,
                    "task_names": n.task_names,
                    "running": running[n.node_id],
                }
                for n in nodes
            ]

    def recover_orphans(
        self,
        grace_seconds: float,
        *,
        observed: Mapping[str, datetime] | None = None,
        max_recoveries: int | None = None,
    ) -> OrphanRecovery:
        """Take the RUNNING jobs of dead nodes back, as ``JobStore.recover_orphans`` does:
        a node is dead when its heartbeat is older than the grace (and, with ``observed``,
        still the one the caller saw); a job no registered node owns is orphaned once its
        claim is older than the grace."""
        with self.state.atomic() as t:
            now = self.state.now()
            cutoff = now - timedelta(seconds=grace_seconds)
            dead = sorted(
                n.node_id
                for n in t.nodes.values()
                if n.heartbeat_ts < cutoff
                and (observed is None or observed.get(n.node_id) == n.heartbeat_ts)
            )

            def orphaned(r: JobRow) -> bool:
                if r.status != RUNNING:
                    return False
                if r.picked_by in dead:
                    return True
                unowned = r.picked_by is None or r.picked_by not in t.nodes
                return unowned and (r.claimed_at is None or r.claimed_at < cutoff)

            requeued: list[str] = []
            given_up: list[JobRow] = []
            queues: set[str] = set()
            for row in [r for r in t.jobs.values() if orphaned(r)]:
                master = row.job_type == JobType.RECURRING.value
                if max_recoveries is not None and row.claims > max_recoveries and not master:
                    row.status, row.finished_at = FAILED, now
                    row.last_error = recovery_limit_record(row.claims, max_recoveries)
                    row.error_traceback = None
                    given_up.append(row)
                else:
                    row.status = PENDING
                    row.clear_claim()
                    requeued.append(row.job_id)
                    queues.add(row.queue)
            self.state.announced.extend(sorted(queues))
            dead_lettered = [r.job_id for r in given_up]
            for row in given_up:
                self.state.cancel_downstream(t, [row.job_id], row.last_error)
            self.state.count_dead_letters(t, given_up)
            gone = set(requeued) | set(dead_lettered)
            t.permits = [p for p in t.permits if p.job_id not in gone and p.node_id not in dead]
            for node_id in dead:
                del t.nodes[node_id]
            for r in t.jobs.values():  # handed to a node no longer registered: anyone's
                if r.status == PENDING and r.picked_by is not None and r.picked_by not in t.nodes:
                    r.picked_by = None
            return OrphanRecovery(sorted(requeued), sorted(dead_lettered), dead, sorted(queues))
