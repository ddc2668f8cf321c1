"""The configuration reference, read from the settings' own declarations.

Every field of :class:`celery_ratchet.settings.RatchetSettings` is a ``ratchet_*`` Celery
setting and a ``RATCHET_*`` environment variable; the ``#:`` comment above the field is its
meaning. The ``ratchet-settings`` directive renders them as a table, and fails the build when a
field has no comment: a setting cannot be added without saying what it does.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

from celery_ratchet import settings as settings_module
from celery_ratchet.settings import _ENV_ALIASES, RatchetSettings


@dataclass(frozen=True)
class SettingDoc:
    name: str
    setting: str
    environment: tuple[str, ...]
    type: str
    default: str
    meaning: str


def _comments_above_fields() -> dict[str, str]:
    """Field name → the ``#:`` lines right above its declaration, joined."""
    source = inspect.getsource(settings_module)
    lines = source.splitlines()
    tree = ast.parse(source)
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == RatchetSettings.__name__):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            comment: list[str] = []
            index = item.lineno - 2
            while index >= 0 and lines[index].strip().startswith("#:"):
                comment.insert(0, lines[index].strip()[2:].strip())
                index -= 1
            found[item.target.id] = " ".join(comment)
    return found


def _default(spec: dataclasses.Field[Any]) -> str:
    if spec.default is not dataclasses.MISSING:
        value: Any = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        value = spec.default_factory()
    else:  # pragma: no cover - every setting has a default
        return "(required)"
    return "unset" if value is None else repr(value)


def setting_docs() -> list[SettingDoc]:
    """Every setting with its names, type, default and meaning ("" when it has none)."""
    comments = _comments_above_fields()
    docs = []
    for spec in dataclasses.fields(RatchetSettings):
        setting = f"ratchet_{spec.name}"
        environment = (setting.upper(),)
        if spec.name in _ENV_ALIASES:
            environment += (_ENV_ALIASES[spec.name],)
        docs.append(
            SettingDoc(
                name=spec.name,
                setting=setting,
                environment=environment,
                type=str(spec.type),
                default=_default(spec),
                meaning=comments.get(spec.name, ""),
            )
        )
    return docs


def undocumented() -> list[str]:
    return [doc.setting for doc in setting_docs() if not doc.meaning]


def setup(app: Any) -> dict[str, Any]:
    from docutils import nodes
    from docutils.parsers.rst import Directive
    from docutils.statemachine import StringList
    from sphinx.errors import ExtensionError

    class SettingsTable(Directive):
        has_content = False

        def run(self) -> list[Any]:
            missing = undocumented()
            if missing:
                raise ExtensionError(
                    "settings without a #: comment in celery_ratchet/settings.py (say what "
                    f"each does): {', '.join(missing)}"
                )
            section = nodes.container()
            for doc in setting_docs():
                entry = nodes.section(ids=[doc.setting.replace("_", "-")])
                entry += nodes.title(text=doc.setting)
                names = nodes.paragraph()
                names += nodes.strong(text="Environment: ")
                for index, env in enumerate(doc.environment):
                    if index:
                        names += nodes.Text(", ")
                    names += nodes.literal(text=env)
                names += nodes.Text(" · ")
                names += nodes.strong(text="Type: ")
                names += nodes.literal(text=doc.type)
                names += nodes.Text(" · ")
                names += nodes.strong(text="Default: ")
                names += nodes.literal(text=doc.default)
                entry += names
                meaning = nodes.container()
                self.state.nested_parse(
                    StringList([doc.meaning], source="celery_ratchet/settings.py"),
                    self.content_offset,
                    meaning,
                )
                entry += meaning.children
                section += entry
            return [section]

    app.add_directive("ratchet-settings", SettingsTable)
    return {"parallel_read_safe": True, "version": "1"}
