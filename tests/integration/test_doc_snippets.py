"""Every Python snippet of the README and of docs/ runs as written, so the documentation cannot
drift from the code.

A page's snippets run in order in one namespace, in a process of their own, in an empty working
directory, with ``RATCHET_URL`` pointing at a fresh SQLite file (the environment variable wins
over a snippet's own ``ratchet_url``, so ``postgresql://app@db.internal/shop`` in the text
needs no server). The example Django project, ``examples/django_app``, is on the path, so a
page can run its snippets on that project's apps. A snippet that cannot run here says why in
an HTML comment right above it: ``<!-- not run: it needs a server of its own -->``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>\S.*?)\s*-->", re.DOTALL)


@dataclass(frozen=True)
class Snippet:
    line: int
    code: str
    not_run: str | None


def pages() -> list[Path]:
    found = [ROOT / "README.md"]
    found += sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return found


def snippets(page: Path) -> list[Snippet]:
    tokens = MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8"))
    found = []
    before = None
    for token in tokens:
        if token.type == "fence" and token.info.split()[:1] in (["python"], ["py"]):
            reason = None
            if before is not None and before.type == "html_block":
                match = NOT_RUN.search(before.content)
                reason = match["reason"] if match else None
            assert token.map is not None
            found.append(Snippet(token.map[0] + 2, token.content, reason))
        if token.type not in {"softbreak"}:
            before = token
    return found


RUNNER = textwrap.dedent(
    """
    import json, sys
    page, blocks = sys.argv[1], json.loads(sys.stdin.read())
    namespace = {"__name__": "__doc_snippets__"}
    for line, code in blocks:
        try:
            exec(compile("\\n" * (line - 1) + code, page, "exec"), namespace)
        except BaseException:
            print(f"the snippet at {page}:{line} failed", file=sys.stderr)
            raise
    """
)


def _run(page: Path, blocks: list[Snippet], workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RATCHET_URL": f"sqlite:///{workdir / 'ratchet.db'}",
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "examples" / "django_app"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "-c", RUNNER, str(page.relative_to(ROOT))],
        input=json.dumps([(s.line, s.code) for s in blocks]),
        capture_output=True,
        text=True,
        cwd=workdir,
        env=env,
        timeout=120,
    )


PAGES = [p for p in pages() if snippets(p)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_pages_snippets_run(page: Path, tmp_path: Path) -> None:
    found = snippets(page)
    blocks = [s for s in found if s.not_run is None]
    done = _run(page, blocks, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]


def test_a_snippet_left_out_says_why() -> None:
    for page in PAGES:
        for snippet in snippets(page):
            assert snippet.not_run is None or len(snippet.not_run) > 10, (
                f"{page}:{snippet.line}: say why the snippet cannot run"
            )
