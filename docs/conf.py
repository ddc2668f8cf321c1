"""Sphinx configuration of the celery_ratchet documentation (``./dev docs`` builds it)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "_ext"))

import celery_ratchet  # noqa: E402

project = "celery_ratchet"
author = "the celery_ratchet authors"
copyright = "the celery_ratchet authors"
release = celery_ratchet.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "settings_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "web/*.png"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
html_theme = "furo"
html_title = "celery_ratchet"
html_static_path: list[str] = []
