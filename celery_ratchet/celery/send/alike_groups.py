"""A group of one task's signatures that differ only in their arguments, as the usual fan-out
``group(task.s(item) for item in items)`` is, sent from one message.

Celery sends each member of a group on its own: it clones and freezes the signature, then
``Signature.apply_async`` → ``Task.apply_async`` → ``send_task`` → ``as_task_v2`` build the
member's message from the same options every time, which is most of the cost of a member.
Here the first member is sent exactly so, and its message, as it reached the app's
``send_task_message``, becomes the others' template: each member gets its own id, arguments,
their representations and its place in the group written in, and goes through the same
``send_task_message`` (signals, ratchet options, the job row). A chord's header is such a
group too (its members carry the chord's body alike). Any group this module cannot vouch for
is sent as Celery sends it: members with options of their own, of several tasks, nested
canvas, times computed at each send (countdown, eta, expires), routers, a task class that
sends in its own way, or a template that does not read as expected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.canvas import Signature
from celery.utils import uuid
from vine import barrier

from celery_ratchet.celery.compat import argument_reprs, freeze_group_id, sends_as_celery
from celery_ratchet.celery.send.collector import paused_collection
from celery_ratchet.celery.send.sender import JobBatch

#: Fewer members are sent as Celery sends them: the template costs a little to check.
MIN_MEMBERS = 8

#: Options whose value Celery turns into something of each send (a time), or that make a
#: member more than a plain task message.
_PER_SEND = frozenset({"countdown", "eta", "expires", "link", "link_error", "chain"})
#: Options a member has of its own once its group is frozen (a chord's header is).
_OWN = frozenset({"task_id", "group_index"})


@dataclass
class _Offered:
    """A member's send as it reached ``send_task_message``: its message, copied before the
    send changed it, and the send's options."""

    name: str
    message: tuple[dict[str, Any], dict[str, Any], Any, dict[str, Any] | None]
    options: dict[str, Any]


_capture: ContextVar[list[_Offered] | None] = ContextVar("ratchet_group_template", default=None)


def offer(name: str, message: Any, options: dict[str, Any]) -> None:
    """Called by the app's ``send_task_message`` with every send: kept when a group is
    taking its template (the first send only), else nothing."""
    taken = _capture.get()
    if taken is None or taken:
        return
    # The send (and its before_task_publish receivers) may change the message in place,
    # at any depth: the template keeps a copy of what Celery made.
    headers, properties, body, event = message
    copied = (_fresh(headers), _fresh(properties), _fresh(body), _fresh(event))
    taken.append(_Offered(name, copied, dict(options)))


@contextmanager
def _capturing() -> Iterator[list[_Offered]]:
    taken: list[_Offered] = []
    token = _capture.set(taken)
    try:
        yield taken
    finally:
        _capture.reset(token)


@dataclass
class _Template:
    """The first member's send, ready to be made the send of another member."""

    name: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    embed: Any
    sent_event: dict[str, Any] | None
    options: dict[str, Any]
    root_is_id: bool
    repr_args: bool
    repr_kwargs: bool

    def __post_init__(self) -> None:
        self._headers = copier(self.headers)
        self._properties = copier(self.properties)
        self._embed = copier(self.embed)

    def message(self, app: Celery, task_id: str, args: Any, kwargs: Any, index: int) -> Any:
        headers = self._headers()
        headers["id"] = task_id
        if self.root_is_id:
            headers["root_id"] = task_id
        headers["group_index"] = index
        if self.repr_args or self.repr_kwargs:
            argsrepr, kwargsrepr = argument_reprs(app, args, kwargs)
            if self.repr_args:
                headers["argsrepr"] = argsrepr
            if self.repr_kwargs:
                headers["kwargsrepr"] = kwargsrepr
        properties = self._properties()
        properties["correlation_id"] = task_id
        sent_event = self.sent_event
        if sent_event is not None:
            sent_event = {
                **sent_event,
                "uuid": task_id,
                "root_id": headers["root_id"],
                "args": headers["argsrepr"],
                "kwargs": headers["kwargsrepr"],
            }
        return headers, properties, (args, kwargs, self._embed()), sent_event


def _template_of(
    app: Celery,
    offered: list[_Offered],
    first: Signature,
    task_id: str,
    merged: dict[str, Any],
    root_given: bool,
) -> _Template | None:
    """The first member's send as a template, if it reads as this module expects: a
    protocol-2 message of this member, with nothing in it that differs by send but the id,
    the arguments and their representations, and the group index."""
    if len(offered) != 1 or offered[0].name != first.task:
        return None
    headers, properties, body, sent_event = offered[0].message
    if not (isinstance(headers, dict) and isinstance(properties, dict)):
        return None
    if not (isinstance(body, tuple) and len(body) == 3):
        return None
    args, kwargs, embed = body
    if (
        headers.get("id") != task_id
        or headers.get("group_index") != 0
        or headers.get("eta") is not None
        or headers.get("expires") is not None
        or properties.get("correlation_id") != task_id
        or tuple(args) != tuple(first.args)
        or kwargs != first.kwargs
    ):
        return None
    argsrepr, kwargsrepr = argument_reprs(app, first.args, first.kwargs)
    repr_args = "argsrepr" not in merged and "argsrepr" not in first.options
    repr_kwargs = "kwargsrepr" not in merged and "kwargsrepr" not in first.options
    if (repr_args and headers.get("argsrepr") != argsrepr) or (
        repr_kwargs and headers.get("kwargsrepr") != kwargsrepr
    ):
        return None  # this Celery represents arguments otherwise: not ours to imitate
    return _Template(
        name=first.task,
        headers=headers,
        properties=properties,
        embed=embed,
        sent_event=sent_event,
        options=offered[0].options,
        # Celery makes a member its own root when none was given (as_task_v2).
        root_is_id=not root_given and headers.get("root_id") == task_id,
        repr_args=repr_args,
        repr_kwargs=repr_kwargs,
    )


def _alike(tasks: Any) -> tuple[str, dict[str, Any]] | None:
    """The task name and the options (but the id) the members share, if they are plain
    signatures of one task with the same options."""
    if not isinstance(tasks, (list, tuple)) or len(tasks) < MIN_MEMBERS:
        return None
    first = tasks[0]
    if type(first) is not Signature or first.subtask_type is not None:
        return None
    name, options = first.task, _shared(first.options)
    if _PER_SEND & options.keys():
        return None
    for sig in tasks:
        if (
            type(sig) is not Signature
            or sig.task != name
            or sig.subtask_type is not None
            or not _same(_shared(sig.options), options)
            or type(sig.args) not in (tuple, list)
            or type(sig.kwargs) is not dict
        ):
            return None
        given = sig.options.get("task_id", _NO_ID)
        if given is not _NO_ID and not (isinstance(given, str) and given):
            return None  # Celery's freeze() refuses it: let it
    return name, options


_NO_ID = object()


def _same(a: Any, b: Any) -> bool:
    """Equal as the message will be written: of the same types, dicts with their keys in
    the same order (``1 == True == 1.0`` would put member 0's value in every message)."""
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _fresh(value: Any) -> Any:
    """A copy of the plain dicts, lists and tuples in ``value``, however deep; anything else
    (a chord's body signature, say) is the same object, as Celery shares it among members."""
    if type(value) is dict:
        return {k: _fresh(v) for k, v in value.items()}
    if type(value) is list:
        return [_fresh(v) for v in value]
    if type(value) is tuple:
        return tuple(_fresh(v) for v in value)
    return value


_CONTAINERS = (dict, list, tuple)


def copier(value: Any) -> Callable[[], Any]:
    """What makes :func:`_fresh` copies of ``value``, a value copied for every member: its
    shape is read once, and each copy walks only the containers in it."""
    kind = type(value)
    if kind is dict:
        nested = {k: copier(v) for k, v in value.items() if type(v) in _CONTAINERS}
        if not nested:
            return value.copy

        def copy_dict() -> dict[Any, Any]:
            copied = value.copy()
            for key, make in nested.items():
                copied[key] = make()
            return copied

        return copy_dict
    if kind is list or kind is tuple:
        if not any(type(v) in _CONTAINERS for v in value):
            return value.copy if kind is list else lambda: value  # a tuple of these: as good
        makers = [copier(v) for v in value]
        if kind is list:
            return lambda: [make() for make in makers]
        return lambda: tuple(make() for make in makers)
    return lambda: value


def _shared(options: dict[str, Any]) -> dict[str, Any]:
    """A member's options but those each member has of its own."""
    if _OWN.isdisjoint(options):
        return options
    return {k: v for k, v in options.items() if k not in _OWN}


def send_alike(
    group: Any,
    args: Any,
    kwargs: Any,
    add_to_parent: bool,
    producer: Any,
    options: dict[str, Any],
) -> Any | None:
    """Send ``group`` (``group.apply_async(args, kwargs, add_to_parent, producer,
    **options)``) from one message, returning its GroupResult; None, with nothing sent, when
    it is not a group of alike members (the caller sends it as Celery does)."""
    app = group.app
    if args or kwargs or app.conf.task_always_eager:
        return None
    found = _alike(group.tasks)
    if found is None:
        return None
    name, _ = found
    task = app.tasks.get(name)
    if task is None or not sends_as_celery(app, task):
        return None
    if producer is not None and not isinstance(producer, JobBatch):
        return None
    merged, group_id, root_id = freeze_group_id(group, options)
    if _PER_SEND & merged.keys():
        return None
    if "group_index" in merged:  # 5.5 and 5.7 send it differently: Celery's own way
        return None
    # As group._apply_tasks takes them: a chord's header carries its body as ``chord``.
    chord = merged.pop("chord", None)
    tasks = group.tasks
    root_given = bool(
        root_id or tasks[0].options.get("root_id") or app.current_worker_task is not None
    )
    if chord is None:
        chord = tasks[0].options.get("chord")  # the members' own, alike in each

    def celery_send(sig: Signature, index: int, target: Any) -> Any:
        # As Celery's group sends a member (group._prepared, then group._apply_tasks).
        member = sig.clone()
        result = member.freeze(group_id=group_id, root_id=root_id, group_index=index)
        if chord is not None and index == len(tasks) - 1:
            app.backend.set_chord_size(group_id, len(tasks))  # each plain member counts one
        member.apply_async(
            producer=target, add_to_parent=False, chord=chord, args=(), kwargs=None, **merged
        )
        return result

    results: list[Any] = []
    ready = barrier()

    def gathered(result: Any) -> None:
        results.append(result)
        if ready and not ready.cancelled and not ready.ready:
            ready.size += 1
            result.then(ready, weak=True)

    with paused_collection(), app.producer_or_acquire(producer) as batch:
        with _capturing() as offered:
            first = celery_send(tasks[0], 0, batch)
        gathered(first)
        template = None
        if isinstance(batch, JobBatch) and batch.jobs and batch.jobs[-1].job_id == first.id:
            template = _template_of(app, offered, tasks[0], first.id, merged, root_given)
        if template is None:
            for index, sig in enumerate(tasks[1:], start=1):
                gathered(celery_send(sig, index, batch))
        else:
            send_member = _member_sender(app, task, template, batch)
            for index, sig in enumerate(tasks[1:], start=1):
                if chord is not None and index == len(tasks) - 1:
                    app.backend.set_chord_size(group_id, len(tasks))
                gathered(send_member(sig, index))
    result = app.GroupResult(group_id, results, ready_barrier=ready)
    ready.finalize()
    parent_task = app.current_worker_task
    if add_to_parent and parent_task:
        parent_task.add_trail(result)
    return result


def _member_sender(
    app: Celery, task: Any, template: _Template, batch: JobBatch
) -> Callable[[Signature, int], Any]:
    send_task_message = app.amqp.send_task_message
    check_arguments = getattr(task, "__header__", None) if task.typing else None
    on_task_call = None if template.headers.get("ignore_result") else app.backend.on_task_call
    options = template.options
    name = template.name

    def send(sig: Signature, index: int) -> Any:
        args, kwargs = tuple(sig.args), sig.kwargs
        if check_arguments is not None:  # as Task.apply_async checks them
            check_arguments(*args, **kwargs)
        task_id = sig.options.get("task_id") or uuid()
        result = task.AsyncResult(task_id)  # as the member's freeze() makes it
        if on_task_call is not None:
            on_task_call(batch, task_id)
        send_task_message(batch, name, template.message(app, task_id, args, kwargs, index),
                          **options)  # fmt: skip
        return result

    return send
