"""Settings: environment beats the Celery setting beats the default; bad values say which."""

from __future__ import annotations

import pytest

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.settings import DEFAULT_URL, RatchetSettings, mask_password


def test_defaults_follow_the_seeds() -> None:
    s = RatchetSettings.from_sources({}, {})
    assert s.url == DEFAULT_URL
    assert (s.node_heartbeat_interval_seconds, s.node_orphan_grace_seconds) == (10, 60)
    assert s.orphan_scan_interval == 300
    assert (s.max_payload_kb, s.poll_interval, s.allow_pickle) == (100, 1.0, False)


def test_environment_overrides_the_celery_setting() -> None:
    conf = {"ratchet_url": "postgresql://conf/db", "ratchet_poll_interval": 2}
    env = {
        "RATCHET_URL": "mysql://env/db",
        "RATCHET_NODE_ORPHAN_GRACE_SECONDS": "90",
        "RATCHET_ALLOW_PICKLE": "yes",
    }
    s = RatchetSettings.from_sources(conf, env)
    assert (s.url, s.poll_interval, s.node_orphan_grace_seconds, s.allow_pickle) == (
        "mysql://env/db",
        2.0,
        90.0,
        True,
    )


def test_seconds_win_over_minutes_for_the_orphan_scan() -> None:
    s = RatchetSettings.from_sources(
        {"ratchet_orphan_scan_interval_minutes": 1}, {"RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": "2.5"}
    )
    assert s.orphan_scan_interval == 2.5


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RATCHET_POLL_INTERVAL": "soon"}, "RATCHET_POLL_INTERVAL = 'soon'"),
        ({"RATCHET_ALLOW_PICKLE": "perhaps"}, "expected true/false"),
        ({"RATCHET_MAX_PAYLOAD_KB": "0"}, "ratchet_max_payload_kb must be positive"),
        ({"RATCHET_QUEUE_PAUSE_CHECK_SECONDS": "nan"}, "ratchet_queue_pause_check_seconds must be"),
        ({"RATCHET_POLL_INTERVAL": "NaN"}, "ratchet_poll_interval must be positive"),
        ({"RATCHET_DEFAULT_PRIORITY": "12"}, "within 0-9"),
        ({"RATCHET_NODE_ORPHAN_GRACE_SECONDS": "5"}, "must exceed"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        RatchetSettings.from_sources({}, env)


def test_passwords_are_masked_in_urls() -> None:
    text = "cannot reach postgresql://app:s3cr3t@db/shop or mysql://root:pw@h:3306/x"
    assert mask_password(text) == (
        "cannot reach postgresql://app:***@db/shop or mysql://root:***@h:3306/x"
    )
    assert mask_password("sqlite:///ratchet.db") == "sqlite:///ratchet.db"


def test_async_limits_default_to_the_seeds_and_read_their_environment_variables() -> None:
    # The seeds: "each job type still has a configurable concurrency limit (default 1000)";
    # their 500 and 2000 are an example of adjusting it.
    s = RatchetSettings.from_sources({}, {})
    assert (s.async_limit_single, s.async_limit_batch_child) == (1000, 1000)
    conf = {"ratchet_async_limit_single": 50, "ratchet_async_limit_batch_child": 60}
    s = RatchetSettings.from_sources(conf, {})
    assert (s.async_limit_single, s.async_limit_batch_child) == (50, 60)
    env = {
        "RATCHET_VIRTUAL_THREAD_LIMIT_SINGLE": "7",
        "RATCHET_VIRTUAL_THREAD_LIMIT_BATCH_CHILD": "8",
    }
    s = RatchetSettings.from_sources(conf, env)
    assert (s.async_limit_single, s.async_limit_batch_child) == (7, 8)
    # The setting's own variable wins over the seeds' name for it.
    s = RatchetSettings.from_sources(conf, {**env, "RATCHET_ASYNC_LIMIT_SINGLE": "9"})
    assert s.async_limit_single == 9


def test_an_async_limit_below_one_names_its_variable() -> None:
    with pytest.raises(ConfigurationError, match="ratchet_async_limit_batch_child"):
        RatchetSettings.from_sources({}, {"RATCHET_VIRTUAL_THREAD_LIMIT_BATCH_CHILD": "0"})
    with pytest.raises(ConfigurationError, match="RATCHET_VIRTUAL_THREAD_LIMIT_SINGLE"):
        RatchetSettings.from_sources({}, {"RATCHET_VIRTUAL_THREAD_LIMIT_SINGLE": "many"})
