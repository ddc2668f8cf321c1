"""Bad input at send time gets a specific error, and nothing is half-written."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery, group

from celery_ratchet import Celery as RatchetCelery
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import (
    ConfigurationError,
    DuplicateJob,
    PayloadTooLarge,
    SerializerNotAllowed,
    StoreUnavailable,
)
from tests.conftest import Servers, empty_store
from tests.integration.conftest import BrokerTrap, make_app


@pytest.fixture
def client_app(servers: Servers, dialect: str, broker_trap: BrokerTrap) -> Celery:
    url = servers.url(dialect)
    empty_store(url)
    return make_app(url, broker_trap.url, ratchet_max_payload_kb=2)


def pending(app: Celery) -> int:
    return ratchet_state(app).store.count_by_status().get("PENDING", 0)


def test_oversized_payload_is_refused_with_size_and_limit(client_app: Celery) -> None:
    with pytest.raises(PayloadTooLarge, match=r"over the limit of 2 KB.*pass a reference"):
        client_app.tasks["t.add"].delay("x" * 4096, "")
    assert pending(client_app) == 0


def test_a_chain_whose_later_step_is_over_the_limit_is_refused_before_anything_runs(
    client_app: Celery,
) -> None:
    add = client_app.tasks["t.add"]
    with pytest.raises(PayloadTooLarge, match=r"'t\.add'"):
        (add.si(1, 1) | add.si("x" * 4096, "")).delay()
    assert pending(client_app) == 0
    # A chain to a big header of small members is not the arguments of any one of them.
    (add.si(1, 1) | group(add.si(i, i) for i in range(60)) | add.s(0)).delay()
    assert pending(client_app) == 1


def test_a_group_is_stored_whole_or_not_at_all(client_app: Celery) -> None:
    add = client_app.tasks["t.add"]
    with pytest.raises(PayloadTooLarge):
        group([add.s(1, 2), add.s(3, 4), add.s("x" * 4096, "")]).apply_async()
    assert pending(client_app) == 0
    group(add.s(i, i) for i in range(50)).apply_async()
    assert pending(client_app) == 50


def test_pickle_is_refused_unless_allowed(client_app: Celery) -> None:
    with pytest.raises(SerializerNotAllowed, match="ratchet_allow_pickle"):
        client_app.tasks["t.add"].apply_async((1, 2), serializer="pickle")
    assert pending(client_app) == 0


def test_an_active_task_id_cannot_be_reused(client_app: Celery) -> None:
    client_app.tasks["t.add"].apply_async((1, 2), task_id="same-id")
    with pytest.raises(DuplicateJob, match="same-id"):
        client_app.tasks["t.add"].apply_async((1, 2), task_id="same-id")


def test_unreachable_database_raises_store_unavailable(
    broker_trap: BrokerTrap, tmp_path: Path
) -> None:
    for url in (
        "postgresql://postgres:secret@127.0.0.1:1/nowhere",
        "mysql://root:secret@127.0.0.1:1/nowhere",
    ):
        app = make_app(url, broker_trap.url, task_publish_retry=False)
        with pytest.raises(StoreUnavailable, match=r"cannot reach the job store") as info:
            app.tasks["t.add"].delay(1, 2)
        assert "secret" not in str(info.value)


def test_rpc_results_are_refused(broker_trap: BrokerTrap, tmp_path: Path) -> None:
    app = make_app(f"sqlite:///{tmp_path / 'r.db'}", broker_trap.url, result_backend="rpc://")
    with pytest.raises(ConfigurationError, match="rpc"):
        app.tasks["t.add"].delay(1, 2)


def test_rpc_results_are_refused_by_a_send_by_name_of_an_app_made_ratchet(
    broker_trap: BrokerTrap, tmp_path: Path
) -> None:
    # Installed before it is configured: the refusal, raised in Celery's configure signal
    # (which only logs its receivers' errors), is raised again by the send.
    app = RatchetCelery("shop", broker=broker_trap.url, set_as_current=False)
    app.conf.update(ratchet_url=f"sqlite:///{tmp_path / 'r.db'}", result_backend="rpc://")
    with pytest.raises(ConfigurationError, match="rpc"):
        app.send_task("t.add", args=(1, 2))
    assert pending(app) == 0
    assert app.conf.broker_url != broker_trap.url
    assert broker_trap.connections == 0


def test_message_protocol_1_is_refused_naming_the_setting(
    broker_trap: BrokerTrap, tmp_path: Path
) -> None:
    app = make_app(f"sqlite:///{tmp_path / 'r.db'}", broker_trap.url, task_protocol=1)
    with pytest.raises(ConfigurationError, match=r"task_protocol = 1.*set it to 2"):
        app.tasks["t.add"].delay(1, 2)


def test_message_protocol_1_set_after_configuring_is_refused_and_nothing_is_written(
    client_app: Celery,
) -> None:
    add = client_app.tasks["t.add"]
    assert client_app.conf.task_protocol == 2  # configured: the ratchet defaults are applied
    client_app.conf.task_protocol = 1  # then changed, before Celery builds its messages
    with pytest.raises(ConfigurationError, match=r"task_protocol = 1"):
        add.delay(1, 2)
    with pytest.raises(ConfigurationError, match=r"task_protocol = 1"):
        group(add.s(i, i) for i in range(3)).apply_async()
    assert pending(client_app) == 0


def test_the_client_never_contacts_the_broker(client_app: Celery, broker_trap: BrokerTrap) -> None:
    before = broker_trap.connections
    add = client_app.tasks["t.add"]
    add.delay(1, 2)
    add.apply_async((1, 2), countdown=5, expires=60, priority=9)
    client_app.send_task("t.add", (1, 2))
    group(add.s(i, i) for i in range(5)).apply_async()
    assert broker_trap.connections == before


def test_bulk_sends_are_one_insert_at_the_end_of_the_block(client_app: Celery) -> None:
    import celery_ratchet

    add = client_app.tasks["t.add"]
    with celery_ratchet.bulk(client_app) as producer:
        for i in range(20):
            add.apply_async((i, i), producer=producer)
        assert pending(client_app) == 0
    assert pending(client_app) == 20
    with pytest.raises(RuntimeError), celery_ratchet.bulk(client_app) as producer:
        add.apply_async((1, 1), producer=producer)
        raise RuntimeError("the caller failed half-way")
    assert pending(client_app) == 20
