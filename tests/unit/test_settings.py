"""Settings: environment beats the Celery setting beats the default; bad values say which."""

from __future__ import annotations

import re

import pytest

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.settings import DEFAULT_URL, RatchetSettings, known_settings, mask_password


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


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"ratchet_ulr": "postgresql://db/shop"}, "ratchet_ulr: did you mean ratchet_url?"),
        ({"ratchet_pool_sise": 2}, "ratchet_pool_sise: did you mean ratchet_pool_size?"),
        ({"ratchet_zzzzzz": 1}, "ratchet_zzzzzz: no setting has a similar name"),
    ],
)
def test_an_unknown_setting_is_refused_with_the_closest_name(
    conf: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"unknown setting {message}"):
        RatchetSettings.from_sources(conf, {})


#: ``app.conf.ratchet_x``, ``conf.get("ratchet_x")``, ``conf["ratchet_x"]``, ``### ratchet_x``.
SETTING_NAMED = r"(?:conf\.|conf\.get\(\"|conf\[\"|### )(ratchet_\w+)"


def test_every_setting_the_code_and_docs_name_is_known() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    named = {
        name
        for pattern in ("celery_ratchet/**/*.py", "docs/**/*.md", "examples/*.py", "README.md")
        for path in root.glob(pattern)
        for name in re.findall(SETTING_NAMED, path.read_text())
    }
    named |= {  # the docs' prose; the metrics' names share the prefix
        name
        for path in root.glob("docs/**/*.md")
        if path.name != "metrics.md"
        for name in re.findall(r"`(ratchet_\w+)", path.read_text())
    }
    named -= {"ratchet_ulr"}  # the misspelling the docs show refused
    assert "ratchet_url" in named and "ratchet_retry_policy" in named
    assert named <= known_settings(), named - known_settings()
    conf = dict.fromkeys(named, None) | {"ratchet_retry_policy": "shop.retry:Policy"}
    RatchetSettings.from_sources(conf, {})


def test_environment_variables_and_other_keys_are_not_checked() -> None:
    # The RATCHET_ prefix is shared (developer tools, test switches); other keys are Celery's.
    env = {"RATCHET_TEST_PROCESSES": "2"}
    s = RatchetSettings.from_sources({"task_default_queue": "q", "ratchetish": 1}, env)
    assert s.url == DEFAULT_URL


def test_a_namespaced_setting_is_checked_under_its_namespace() -> None:
    class Namespaced(dict[str, object]):
        prefix = "CELERY_"

    conf = Namespaced(CELERY_RATCHET_URL="sqlite://", CELERY_RATCHET_DATABASE="default")
    RatchetSettings.from_sources(conf, {})
    conf["CELERY_RATCHET_ULR"] = "sqlite://"
    with pytest.raises(
        ConfigurationError, match="CELERY_RATCHET_ULR: did you mean CELERY_RATCHET_URL"
    ):
        RatchetSettings.from_sources(conf, {})
