"""The dashboard in a Django project, behind the project's own authentication::

    # urls.py
    from django.contrib.admin.views.decorators import staff_member_required
    from django.urls import re_path
    from django.conf import settings
    import celery_ratchet
    from celery_ratchet.contrib.django.dashboard import wsgi_view
    from proj.celery import app

    ratchet = celery_ratchet.dashboard(app, secret=settings.SECRET_KEY)
    urlpatterns = [
        re_path(r"^ratchet(?P<path>/.*)?$", staff_member_required(wsgi_view(ratchet))),
    ]

The view hands the request to the WSGI application as if it were mounted at the URL the
pattern matched (``SCRIPT_NAME``), so its links and redirects stay under it. It is exempt
from Django's CSRF check: the dashboard checks its own token on every POST.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def wsgi_view(wsgi_app: WsgiApp) -> Callable[..., HttpResponse]:
    """A Django view serving ``wsgi_app`` under its URL pattern, whose ``path`` group is the
    part of the URL after the prefix (``/jobs``; none for the prefix itself)."""

    @csrf_exempt
    def view(request: HttpRequest, path: str | None = None) -> HttpResponse:
        rest = path or ""
        full = request.path
        body = request.body
        environ = dict(request.META)
        environ.update(
            {
                "SCRIPT_NAME": full[: len(full) - len(rest)].rstrip("/"),
                "PATH_INFO": rest or "/",
                "CONTENT_LENGTH": str(len(body)),
                "wsgi.input": io.BytesIO(body),
            }
        )
        answered: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], *exc: Any) -> None:
            answered.update(status=int(status.split()[0]), headers=headers)

        chunks = wsgi_app(environ, start_response)
        try:
            content = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        response = HttpResponse(content, status=answered["status"])
        for name, value in answered["headers"]:
            response[name] = value
        return response

    return view
