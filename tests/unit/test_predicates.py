"""Workflow conditions run only functions the application allowed."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

import celery_ratchet
from celery_ratchet.celery.canvas.workflows import WorkflowError, resolve_predicate
from celery_ratchet.errors import ConfigurationError, PredicateNotAllowed, RatchetError
from celery_ratchet.settings import RatchetSettings


@celery_ratchet.predicate
def _registered(value: Any) -> bool:
    return bool(value)


class _Rules:
    @staticmethod
    def nested(value: Any) -> bool:
        return value == "nested"


def test_a_decorated_function_is_found_by_module_and_qualname() -> None:
    assert resolve_predicate(f"{__name__}:_registered", ()) is _registered


@pytest.mark.parametrize(
    "path", ["os:system", "builtins:eval", "subprocess:run", "importlib:import_module"]
)
def test_anything_else_is_refused_without_being_imported(path: str) -> None:
    with pytest.raises(PredicateNotAllowed, match="ratchet_predicate_modules") as caught:
        resolve_predicate(path, ("tests",))
    assert isinstance(caught.value, RatchetError)


def test_a_module_that_is_not_allowed_is_never_imported() -> None:
    name = "tests.unit._never_imported_predicates"
    with pytest.raises(PredicateNotAllowed):
        resolve_predicate(f"{name}:anything", ("shop",))
    assert name not in sys.modules


def test_allowed_modules_are_package_prefixes() -> None:
    path = f"{__name__}:_Rules.nested"
    assert resolve_predicate(path, ("tests.unit",))("nested") is True
    assert resolve_predicate(path, (__name__,))("nested") is True
    with pytest.raises(PredicateNotAllowed):
        resolve_predicate(path, ("tests.un",))  # a prefix of the name, not of the package
    with pytest.raises(WorkflowError, match="cannot be imported"):
        resolve_predicate("tests.unit.test_predicates:no_such_function", ("tests",))
    with pytest.raises(WorkflowError, match="not callable"):
        resolve_predicate("tests.unit.test_predicates:__doc__", ("tests",))
    with pytest.raises(WorkflowError, match=r"package\.module:function"):
        resolve_predicate("_registered", ("tests",))


@pytest.mark.parametrize(
    "path",
    [
        "tests.unit.test_predicates:sys.exit",  # through a module it imported
        "tests.unit.test_predicates:resolve_predicate",  # imported into it, defined elsewhere
        "tests.unit.test_predicates:pytest.main",
    ],
)
def test_an_allowed_package_does_not_lend_out_what_it_imports(path: str) -> None:
    with pytest.raises(PredicateNotAllowed):
        resolve_predicate(path, ("tests",))


def test_a_predicate_of_a_script_is_also_known_by_the_module_name_workers_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    main = types.ModuleType("__main__")
    main.__file__ = "/srv/app/shop_rules.py"
    monkeypatch.setitem(sys.modules, "__main__", main)

    def is_high(value: Any) -> bool:
        return bool(value > 0.8)

    is_high.__module__ = "__main__"
    is_high.__qualname__ = "is_high"
    celery_ratchet.predicate(is_high)
    assert resolve_predicate("shop_rules:is_high", ()) is is_high
    assert resolve_predicate("__main__:is_high", ()) is is_high


def test_predicate_modules_setting() -> None:
    assert RatchetSettings.from_sources({}).predicate_modules == ()
    conf = {"ratchet_predicate_modules": ["shop", "billing.rules"]}
    assert RatchetSettings.from_sources(conf).predicate_modules == ("shop", "billing.rules")
    env = {"RATCHET_PREDICATE_MODULES": "shop, billing.rules"}
    assert RatchetSettings.from_sources({}, env).predicate_modules == ("shop", "billing.rules")
    with pytest.raises(ConfigurationError, match="not a module name"):
        RatchetSettings.from_sources({"ratchet_predicate_modules": ["shop:rules"]})
