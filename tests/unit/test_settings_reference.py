"""The configuration reference is generated from the settings' declarations: every setting must
say what it does, and a setting read outside RatchetSettings must be on the page by hand."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from settings_reference import setting_docs, undocumented  # noqa: E402

READ_ELSEWHERE = re.compile(
    r"""conf(?:\.get\(\s*["']|\.)(ratchet_[a-z0-9_]+)|environ\.get\(\s*["'](RATCHET_[A-Z0-9_]+)"""
)


def test_every_setting_says_what_it_does() -> None:
    assert undocumented() == []


def test_every_setting_has_its_environment_variable() -> None:
    for doc in setting_docs():
        assert doc.environment[0] == doc.setting.upper()


def test_settings_read_outside_the_declarations_are_on_the_reference_page() -> None:
    declared = {doc.setting for doc in setting_docs()}
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    read = set()
    for source in (ROOT / "celery_ratchet").rglob("*.py"):
        for conf_name, env_name in READ_ELSEWHERE.findall(source.read_text()):
            read.add(conf_name or env_name.lower())
    assert read, "the pattern no longer finds settings read from app.conf or the environment"
    missing = sorted(name for name in read - declared if f"### {name}" not in page)
    assert missing == [], f"document these in docs/reference/configuration.md: {missing}"
