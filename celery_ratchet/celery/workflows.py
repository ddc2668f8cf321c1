"""``celery_ratchet.workflow()``: conditional branches stored as rows, decided once.

    celery_ratchet.workflow(analyze.s(data_id))
        .on_success(archive.s(), name="archive")
        .on_failure(notify_admins.s())
        .when_result("shop.rules:is_high_score", escalate.s(), name="escalate")
        .join(["archive", "escalate"], report.s())
        .submit()

The branches are stored with the parent job when it is submitted. When the parent ends, a
system job evaluates them in order: several may fire (fan-out); each is decided exactly once
(a compare-and-swap per branch, in the transaction that sends the fired ones). A join waits
for the branches it names that fired (a chord of them). Predicates are importable
functions named by ``"module:function"`` — never pickled code — called with the parent's
result.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, chord
from celery.canvas import Signature, maybe_signature
from celery.result import AsyncResult
from celery.utils.imports import symbol_by_name

from celery_ratchet.celery.app import ratchet_state
from celery_ratchet.celery.batches import decode_signature, encode_signature, send_within
from celery_ratchet.celery.sender import current_transaction
from celery_ratchet.store.batches import decide

logger = logging.getLogger(__name__)

ADVANCE_TASK = "celery_ratchet.workflow_advance"
FAILED_TASK = "celery_ratchet.workflow_failed"

SUCCESS, FAILURE, RESULT, JOIN = "SUCCESS", "FAILURE", "RESULT", "JOIN"


class WorkflowError(ValueError):
    """A workflow that cannot be stored as given (bad predicate, unknown join name)."""


@dataclass
class _Branch:
    kind: str
    sig: Signature
    name: str | None = None
    predicate: str | None = None
    waits_for: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SubmittedWorkflow:
    parent: AsyncResult
    #: Results of the named branches (they exist once the branch fired).
    branches: dict[str, AsyncResult]

    @property
    def id(self) -> str:
        return str(self.parent.id)


class WorkflowBuilder:
    def __init__(self, parent: Any, app: Celery | None = None) -> None:
        found = maybe_signature(parent, app=app)
        if not isinstance(found, Signature):
            raise TypeError(f"workflow(): expected a task signature (task.s(...)), got {parent!r}")
        self.parent = found
        self.app = app
        self._branches: list[_Branch] = []

    def on_success(self, sig: Any, name: str | None = None) -> WorkflowBuilder:
        return self._add(SUCCESS, sig, name)

    def on_failure(self, sig: Any, name: str | None = None) -> WorkflowBuilder:
        """Sent when the parent fails for good (after its retries)."""
        return self._add(FAILURE, sig, name)

    def when_result(self, predicate: str, sig: Any, name: str | None = None) -> WorkflowBuilder:
        """Sent when the parent succeeds and ``predicate(result)`` is true; ``predicate`` is
        the import path of a function, ``"package.module:function"``."""
        _load_predicate(predicate)
        return self._add(RESULT, sig, name, predicate=predicate)

    def join(self, names: Sequence[str], sig: Any) -> WorkflowBuilder:
        """Sent once every named branch that fired has finished, with their results."""
        known = {b.name for b in self._branches if b.kind != JOIN}
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise WorkflowError(
                f"join({list(names)!r}): name branches added before the join; unknown: {unknown}"
            )
        joined = {n for b in self._branches if b.kind == JOIN for n in b.waits_for}
        if joined & set(names):
            raise WorkflowError(f"branches {sorted(joined & set(names))} are in another join")
        return self._add(JOIN, sig, None, waits_for=list(names))

    def _add(
        self,
        kind: str,
        sig: Any,
        name: str | None,
        predicate: str | None = None,
        waits_for: list[str] | None = None,
    ) -> WorkflowBuilder:
        found = maybe_signature(sig, app=self.app)
        if not isinstance(found, Signature):
            raise TypeError(f"expected a task signature (task.s(...)), got {sig!r}")
        if name is not None and any(b.name == name for b in self._branches):
            raise WorkflowError(f"two branches are named {name!r}")
        if name is not None and "," in name:
            raise WorkflowError(f"branch name {name!r}: no commas")
        self._branches.append(_Branch(kind, found, name, predicate, waits_for or []))
        return self

    def submit(self) -> SubmittedWorkflow:
        if not self._branches:
            raise WorkflowError("a workflow needs at least one branch; send the task instead")
        parent = self.parent.clone()
        app = self.app or parent._app or _current_app()
        branches = [dataclasses.replace(b, sig=b.sig.clone()) for b in self._branches]
        parent_result = parent.freeze()
        parent_id = str(parent_result.id)
        rows = []
        named: dict[str, AsyncResult] = {}
        for branch in branches:
            result = branch.sig.freeze()  # ids fixed now: the stored branch is the one sent
            if branch.name:
                named[branch.name] = result
            rows.append(
                {
                    "kind": branch.kind,
                    "name": branch.name,
                    "predicate": branch.predicate,
                    "waits_for": ",".join(branch.waits_for) or None,
                    "branch": encode_signature(branch.sig),
                }
            )
        ratchet_state(app).batches.add_conditions(parent_id, rows, current_transaction())
        parent.link(app.signature(ADVANCE_TASK, kwargs={"parent_id": parent_id}))
        parent.link_error(app.signature(FAILED_TASK, kwargs={"parent_id": parent_id}))
        parent.apply_async()
        return SubmittedWorkflow(parent_result, named)


def workflow(parent: Any, app: Celery | None = None) -> WorkflowBuilder:
    """Start building a conditional workflow; see the module's documentation."""
    return WorkflowBuilder(parent, app)


def _load_predicate(path: str) -> Any:
    if ":" not in path:
        raise WorkflowError(
            f"predicate {path!r}: give the import path of a function, 'package.module:function'"
        )
    try:
        found = symbol_by_name(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise WorkflowError(f"predicate {path!r} cannot be imported: {exc}") from exc
    if not callable(found):
        raise WorkflowError(f"predicate {path!r} is not callable")
    return found


def _current_app() -> Celery:
    from celery import current_app

    return current_app._get_current_object()


def advance(app: Celery, parent_id: str, result: Any, failed: bool) -> list[str]:
    """Decide a finished parent's branches, each once; returns the tasks sent.

    Branches get the parent's result as their first argument (its id when it failed), as
    Celery's ``link`` and ``link_error`` do; immutable signatures (``.si``) get nothing."""
    batches = ratchet_state(app).batches
    rows = batches.conditions(parent_id)
    if not rows:
        logger.warning("ratchet: workflow %s has no stored branches", parent_id)
        return []
    sent: list[str] = []
    with batches.deciding(parent_id) as conn:
        if conn is None:
            return []  # decided by an earlier run of this job
        fired: dict[str, Signature] = {}
        to_send: list[Signature] = []
        for row in rows:
            if row.kind == JOIN or row.state != "WAITING":
                continue
            fires = _fires(row, result, failed, parent_id)
            if not decide(conn, parent_id, row.position, fires) or not fires:
                continue
            stored = decode_signature(app, row.branch)
            assert stored is not None
            # As Celery's link and link_error: the result, or the id of the failed parent.
            sig = stored.clone(args=(parent_id,) if failed else (result,))
            if row.name:
                fired[row.name] = sig
            to_send.append(sig)
        for row in rows:
            if row.kind != JOIN or row.state != "WAITING":
                continue
            if not decide(conn, parent_id, row.position, True):
                continue
            body = decode_signature(app, row.branch)
            assert body is not None
            members = [fired[n] for n in (row.waits_for or "").split(",") if n in fired]
            to_send = [s for s in to_send if all(s is not m for m in members)]
            to_send.append(chord(members, body) if members else body.clone(args=([],)))
        for sig in to_send:
            send_within(conn, sig.apply_async)
            sent.append(str(sig.get("task") or sig.get("subtask_type")))
    logger.info("ratchet: workflow %s sent %s", parent_id, sent or "nothing")
    return sent


def _fires(row: Any, result: Any, failed: bool, parent_id: str) -> bool:
    if row.kind == SUCCESS:
        return not failed
    if row.kind == FAILURE:
        return failed
    if row.kind == RESULT and not failed:
        try:
            return bool(_load_predicate(row.predicate)(result))
        except Exception as exc:
            logger.error(
                "ratchet: workflow %s: predicate %s raised %r; its branch is skipped",
                parent_id,
                row.predicate,
                exc,
            )
    return False


def register_tasks(app: Celery) -> None:
    @app.task(name=ADVANCE_TASK, shared=False, bind=True)
    def workflow_advance(self: Any, result: Any, *, parent_id: str) -> list[str]:
        """The parent succeeded: decide its branches."""
        return advance(self.app, parent_id, result, failed=False)

    @app.task(name=FAILED_TASK, shared=False, bind=True)
    def workflow_failed(self: Any, task_id: str, *, parent_id: str) -> list[str]:
        """The parent failed for good: decide its branches (its failure branches fire)."""
        return advance(self.app, parent_id, None, failed=True)
