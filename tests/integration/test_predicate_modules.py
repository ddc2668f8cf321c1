"""``ratchet_predicate_modules``: conditions from the application's packages, decided by a
real worker; the same name is refused by an app that does not list the package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import PredicateNotAllowed
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app, worker_running

TIMEOUT = 30


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def allowing_app(
    request: pytest.FixtureRequest, servers: Servers, broker_trap: BrokerTrap
) -> Iterator[Celery]:
    url = empty_store(servers.url(request.param)).url
    app = make_app(url, broker_trap.url, ratchet_predicate_modules=["tests.integration"])
    with worker_running(app):
        yield app


def test_a_function_of_an_allowed_package_is_a_condition(allowing_app: Celery) -> None:
    add = allowing_app.tasks["t.add"]
    submitted = (
        celery_ratchet.workflow(add.si(2, 3), app=allowing_app)
        .when_result("tests.integration.tasks:is_small", add.s(10), name="small")
        .when_result("tests.integration.tasks:is_big", add.s(1000), name="big")
        .submit()
    )
    assert submitted.branches["small"].get(timeout=TIMEOUT) == 15
    states = [c.state for c in ratchet_state(allowing_app).batches.conditions(submitted.id)]
    assert states == ["FIRED", "SKIPPED"]
    with pytest.raises(PredicateNotAllowed):  # the package is allowed, not the whole world
        celery_ratchet.workflow(add.si(1, 1), app=allowing_app).when_result("os:system", add.s(1))


def test_an_app_that_does_not_list_the_package_refuses_it(
    servers: Servers, broker_trap: BrokerTrap
) -> None:
    app = make_app(empty_store(servers.url("sqlite")).url, broker_trap.url)
    builder = celery_ratchet.workflow(app.tasks["t.add"].si(1, 1), app=app)
    with pytest.raises(PredicateNotAllowed, match="ratchet_predicate_modules"):
        builder.when_result("tests.integration.tasks:is_small", app.tasks["t.add"].s(1))
