"""A group's template is copied for every member: each copy equals what a deep copy of its
plain containers gives, and shares none of them with the template or another copy."""

from __future__ import annotations

from typing import Any

from celery.canvas import Signature
from hypothesis import given
from hypothesis import strategies as st

from celery_ratchet.celery.send.alike_groups import _fresh, copier

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=15,
)


def _containers(value: Any) -> list[Any]:
    """Every list and dict in ``value``, however deep."""
    found: list[Any] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if type(item) in (dict, list):
            found.append(item)
        if type(item) is dict:
            pending.extend(item.values())
        elif type(item) in (list, tuple):
            pending.extend(item)
    return found


@given(_VALUES)
def test_a_copy_equals_the_template_and_shares_no_container_with_it(value: Any) -> None:
    make = copier(value)
    first, second = make(), make()
    assert first == value == second == _fresh(value)
    assert type(first) is type(value)
    template_ids = {id(c) for c in _containers(value)}
    for copy in (first, second):
        assert template_ids.isdisjoint(id(c) for c in _containers(copy))
    assert {id(c) for c in _containers(first)}.isdisjoint(id(c) for c in _containers(second))


def test_a_copy_keeps_the_key_order_and_shares_what_celery_shares() -> None:
    body = Signature("t.body", args=(1,))
    template = {"z": 1, "a": [None, None], "chord": body, "stamps": {}}
    copy = copier(template)()
    assert list(copy) == ["z", "a", "chord", "stamps"]
    assert copy["chord"] is body  # a chord's body signature: one object, as Celery shares it
    copy["a"][0] = "changed"
    copy["stamps"]["k"] = "v"
    assert template == {"z": 1, "a": [None, None], "chord": body, "stamps": {}}
