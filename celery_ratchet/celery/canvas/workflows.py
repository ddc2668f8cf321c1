"""``celery_ratchet.workflow()``: conditional branches stored as rows, decided once.

    @celery_ratchet.predicate            # in shop/rules.py
    def is_high_score(result): ...

    celery_ratchet.workflow(analyze.s(data_id))
        .on_success(archive.s(), name="archive")
        .on_failure(notify_admins.s())
        .when_result("shop.rules:is_high_score", escalate.s(), name="escalate")
        .join(["archive", "escalate"], report.s())
        .submit()

The branches are stored with the parent job when it is submitted. When the parent ends, a
system job evaluates them in order: several may fire (fan-out); each is decided exactly once
(a compare-and-swap per branch, in the transaction that sends the fired ones). A join waits
for the branches it names that fired (a chord of them). Predicates are functions named by
``"module:function"`` — never pickled code — called with the parent's result, and only
functions the application allowed: decorated with :func:`predicate`, or in a module under
one of ``ratchet_predicate_modules``. Any other name is refused at ``submit()``; one found in
a stored row (written by hand) is refused when the branch is decided: the branch is FAILED,
its task never sent, and its result raises :class:`~celery_ratchet.errors.PredicateNotAllowed`.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from celery import Celery, chord
from celery.canvas import Signature, maybe_signature
from celery.result import AsyncResult

from celery_ratchet.celery.canvas.batches import decode_signature, encode_signature, send_within
from celery_ratchet.celery.compat import current_app_object, signature_app
from celery_ratchet.celery.results.backend import exception_record
from celery_ratchet.celery.send.transactions import joined
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus, JobType
from celery_ratchet.domain.workflow import (
    FAILURE,
    JOIN,
    RESULT,
    SUCCESS,
    WAITING,
    Branch,
    Send,
    Verdict,
    decide_branches,
    fires_on_outcome,
)
from celery_ratchet.errors import PredicateNotAllowed, RatchetError, WorkflowError

logger = logging.getLogger(__name__)

ADVANCE_TASK = "celery_ratchet.workflow_advance"
FAILED_TASK = "celery_ratchet.workflow_failed"


#: Predicates the application allowed with :func:`predicate`, by ``"module:qualname"``.
_PREDICATES: dict[str, Callable[[Any], Any]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def predicate(fn: F) -> F:
    """Allow ``fn`` as a workflow condition, named ``"module:qualname"`` in ``when_result``::

        @celery_ratchet.predicate
        def is_high_score(result): return result > 0.8

    The worker deciding the workflow must have imported the module (as it imports tasks)."""
    if not callable(fn):
        raise TypeError(f"@celery_ratchet.predicate decorates a function, got {fn!r}")
    module, name = fn.__module__, fn.__qualname__
    _PREDICATES[f"{module}:{name}"] = fn
    if module == "__main__":  # a script: also under the name its workers import it by
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        path = getattr(main, "__file__", None)
        alias = spec.name if spec is not None else (path and Path(path).stem)
        if alias:
            _PREDICATES[f"{alias}:{name}"] = fn
    return fn


def resolve_predicate(path: str, allowed_modules: Sequence[str]) -> Callable[[Any], Any]:
    """The function a condition names, if the application allowed it; never imports a
    module outside ``allowed_modules`` (importing runs the module's code)."""
    module, sep, name = path.partition(":") if isinstance(path, str) else ("", "", "")
    if not sep or not module or not name:
        raise WorkflowError(
            f"predicate {path!r}: give the import path of a function, 'package.module:function'"
        )
    registered = _PREDICATES.get(path)
    if registered is not None:
        return registered
    if not _within(module, allowed_modules):
        raise PredicateNotAllowed(path)
    found: Any
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
            if isinstance(found, ModuleType):  # "shop.rules:os.system" reaches past shop
                break
    except (ImportError, AttributeError, ValueError) as exc:
        raise WorkflowError(f"predicate {path!r} cannot be imported: {exc}") from exc
    if isinstance(found, ModuleType):
        raise PredicateNotAllowed(path)
    if not callable(found):
        raise WorkflowError(f"predicate {path!r} is not callable")
    # Defined in the allowed packages, not imported into them ("from os import system").
    if not _within(str(getattr(found, "__module__", None) or ""), allowed_modules):
        raise PredicateNotAllowed(path)
    return found


def _within(module: str, packages: Sequence[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages if p)


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
        the import path of a function, ``"package.module:function"``, allowed with
        ``@celery_ratchet.predicate`` or by ``ratchet_predicate_modules``."""
        _load_predicate(self.app or signature_app(self.parent) or _current_app(), predicate)
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
        app = self.app or signature_app(parent) or _current_app()
        for b in self._branches:
            if b.predicate is not None:
                _load_predicate(app, b.predicate)
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
        with joined(app) as unit:
            ratchet_state(app).batches.add_conditions(parent_id, rows, unit)
        parent.link(app.signature(ADVANCE_TASK, kwargs={"parent_id": parent_id}))
        parent.link_error(app.signature(FAILED_TASK, kwargs={"parent_id": parent_id}))
        parent.apply_async()
        return SubmittedWorkflow(parent_result, named)


def workflow(parent: Any, app: Celery | None = None) -> WorkflowBuilder:
    """Start building a conditional workflow; see the module's documentation."""
    return WorkflowBuilder(parent, app)


def _load_predicate(app: Celery, path: str) -> Callable[[Any], Any]:
    return resolve_predicate(path, ratchet_state(app).settings.predicate_modules)


def _current_app() -> Celery:
    return current_app_object()


def advance(app: Celery, parent_id: str, result: Any, failed: bool) -> list[str]:
    """Decide a finished parent's branches, each once; returns the tasks sent.

    Branches get the parent's result as their first argument (its id when it failed), as
    Celery's ``link`` and ``link_error`` do; immutable signatures (``.si``) get nothing."""
    batches = ratchet_state(app).batches
    branches = batches.conditions(parent_id)
    if not branches:
        logger.warning("ratchet: workflow %s has no stored branches", parent_id)
        return []
    by_position = {b.position: b for b in branches}
    sent: list[str] = []
    refusals: dict[int, RatchetError] = {}
    with batches.deciding(parent_id) as unit:
        if unit is None:
            return []  # decided by an earlier run of this job
        verdicts = {}
        for branch in branches:
            if branch.kind == JOIN or branch.state != WAITING:
                continue
            try:
                fires = _fires(app, branch, result, failed, parent_id)
            except (PredicateNotAllowed, WorkflowError) as exc:
                verdicts[branch.position] = Verdict.REFUSED
                refusals[branch.position] = exc
                continue
            verdicts[branch.position] = Verdict.FIRES if fires else Verdict.SKIPPED
        decisions = decide_branches(branches, verdicts)
        decided = batches.decide(unit, parent_id, decisions.states)
        for send in decisions.sends(decided):
            sig = _signature_to_send(app, send, by_position, parent_id, result, failed)
            send_within(unit, sig.apply_async, JobType.WORKFLOW_BRANCH)
            sent.append(str(sig.get("task") or sig.get("subtask_type")))
    for position, refusal in refusals.items():
        if position in decided:
            _fail_refused_branch(app, parent_id, by_position[position], refusal)
    logger.info("ratchet: workflow %s sent %s", parent_id, sent or "nothing")
    return sent


def _signature_to_send(
    app: Celery,
    send: Send,
    branches: dict[int, Branch],
    parent_id: str,
    result: Any,
    failed: bool,
) -> Signature:
    stored = decode_signature(app, branches[send.position].encoded)
    assert stored is not None
    if not send.is_join:
        # As Celery's link and link_error: the result, or the id of the failed parent.
        return stored.clone(args=(parent_id,) if failed else (result,))
    members = [
        _signature_to_send(app, Send(m), branches, parent_id, result, failed) for m in send.members
    ]
    return chord(members, stored) if members else stored.clone(args=([],))


def _fail_refused_branch(app: Celery, parent_id: str, row: Branch, exc: RatchetError) -> None:
    """A stored condition names a function the application never allowed (or none at all):
    the branch is FAILED unrun, and its task's result says why."""
    logger.error("ratchet: workflow %s: branch %s not run: %s", parent_id, row.position, exc)
    try:
        stored = decode_signature(app, row.encoded)
    except (TypeError, ValueError):
        return
    task_id = (stored.options or {}).get("task_id") if stored is not None else None
    if task_id:
        ratchet_state(app).store.store_untracked_result(
            str(task_id),
            str(stored.get("task") or ""),  # type: ignore[union-attr]
            JobStatus.FAILED,
            error=exception_record(exc),
        )


def _fires(app: Celery, branch: Branch, result: Any, failed: bool, parent_id: str) -> bool:
    on_outcome = fires_on_outcome(branch, failed)
    if on_outcome is not None:
        return on_outcome
    found = _load_predicate(app, branch.predicate or "")  # refused: the branch fails
    try:
        return bool(found(result))
    except Exception as exc:
        logger.error(
            "ratchet: workflow %s: predicate %s raised %r; its branch is skipped",
            parent_id,
            branch.predicate,
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
