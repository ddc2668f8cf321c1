"""The dashboard mounted in a Django, a Flask and a FastAPI application, behind each one's own
authentication, driven by each framework's test client: a page and ``/metrics`` answer under
the prefix, links and redirects stay under it (``SCRIPT_NAME``), a POST without the dashboard's
CSRF token is refused, one with it acts, and a form one process rendered is accepted by another
that shares the application's secret."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from a2wsgi import WSGIMiddleware
from celery import Celery
from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse
from fastapi.testclient import TestClient
from flask import Flask, redirect, session
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.middleware.dispatcher import DispatcherMiddleware

import celery_ratchet
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.web.app import Dashboard
from celery_ratchet.web.guard import HostAllowlist
from tests.conftest import empty_store
from tests.helpers import Tripwire
from tests.integration.conftest import make_app

ROOT = Path(__file__).resolve().parents[2]
SECRET = "the-application's-own-secret-key"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    trap = Tripwire()
    made = make_app(empty_store(f"sqlite:///{tmp_path / 'mount.db'}").url, trap.url)
    yield made
    trap.close()
    assert trap.connections == 0


def pending_job(app: Celery) -> str:
    return str(app.send_task("t.add", args=(1, 2), queue="celery").id)


def metrics_of(text: str) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def links(html: str) -> list[str]:
    return re.findall(r'(?:href|action|src)="([^"]+)"', html)


# -- Flask: Werkzeug's DispatcherMiddleware, behind the application's session ----------------


def flask_shop(app: Celery) -> Flask:
    shop = Flask("shop")
    shop.secret_key = SECRET
    ratchet = celery_ratchet.dashboard(app, secret=shop.secret_key)

    @shop.post("/login")
    def login() -> str:
        session["user"] = "ops"
        return "signed in"

    def signed_in(wsgi_app: Any) -> Any:
        def guarded(environ: dict[str, Any], start_response: Any) -> Any:
            with shop.request_context(environ):
                allowed = session.get("user") is not None
            if not allowed:
                return redirect("/login")(environ, start_response)
            return wsgi_app(environ, start_response)

        return guarded

    shop.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        shop.wsgi_app, {"/ratchet": signed_in(ratchet)}
    )
    return shop


def test_flask_mount_serves_pages_and_metrics_under_its_prefix(app: Celery) -> None:
    job_id = pending_job(app)
    client = flask_shop(app).test_client()
    assert client.get("/ratchet/jobs").status_code == 302, "not signed in: the shop's login"
    client.post("/login")

    page = client.get("/ratchet/jobs")
    assert page.status_code == 200 and job_id in page.text
    shown = links(page.text)
    assert shown and all(u.startswith("/ratchet/") for u in shown if u.startswith("/")), shown

    scraped = client.get("/ratchet/metrics")
    assert scraped.status_code == 200
    assert metrics_of(scraped.text)["ratchet_jobs[('queue', 'celery'), ('status', 'PENDING')]"] == 1

    refused = client.post("/ratchet/jobs/cancel", data={"job_id": job_id})
    assert refused.status_code == 403
    [token] = set(CSRF.findall(page.text))
    asked = client.post("/ratchet/jobs/cancel", data={"job_id": job_id, "csrf": token})
    assert asked.status_code == 200 and 'action="/ratchet/jobs/cancel"' in asked.text
    form = {"job_id": job_id, "csrf": token, "confirmed": "yes"}
    done = client.post("/ratchet/jobs/cancel", data=form)
    assert done.status_code == 303 and done.headers["Location"].startswith("/ratchet/")
    assert app.AsyncResult(job_id).state == "REVOKED"


def test_a_form_of_one_process_is_accepted_by_another_sharing_the_secret(app: Celery) -> None:
    """Two Dashboard objects stand for two processes of one application (gunicorn's workers)."""
    job_id = pending_job(app)
    one = flask_shop(app).test_client()
    other = flask_shop(app).test_client()
    for client in (one, other):
        client.post("/login")
    [token] = set(CSRF.findall(one.get("/ratchet/jobs").text))
    form = {"job_id": job_id, "csrf": token, "confirmed": "yes"}
    assert other.post("/ratchet/jobs/cancel", data=form).status_code == 303
    alone = [Dashboard(ratchet_state(app).store) for _ in range(2)]
    assert alone[0].guard.csrf_token != alone[1].guard.csrf_token, "no secret: one per process"


@pytest.mark.parametrize("back", ["/\\evil.com", "//evil.com", "https://evil.com", "/../shop"])
def test_flask_mount_never_redirects_out_of_its_prefix(app: Celery, back: str) -> None:
    job_id = pending_job(app)
    client = flask_shop(app).test_client()
    client.post("/login")
    [token] = set(CSRF.findall(client.get("/ratchet/jobs").text))
    form = {"job_id": job_id, "csrf": token, "confirmed": "yes", "back": back}
    done = client.post("/ratchet/jobs/cancel", data=form)
    assert done.status_code == 303, done.text
    assert done.headers["Location"].startswith("/ratchet/job?id="), done.headers["Location"]


# -- FastAPI: a2wsgi's WSGIMiddleware, behind a middleware of the application's ---------------


def test_fastapi_mount_serves_pages_and_metrics_under_its_prefix(app: Celery) -> None:
    from starlette.middleware.sessions import SessionMiddleware

    job_id = pending_job(app)
    api = FastAPI()
    ratchet = celery_ratchet.dashboard(
        app, secret=SECRET, hosts=HostAllowlist(frozenset({"testserver"}), loopback=True)
    )
    api.mount("/ratchet", WSGIMiddleware(ratchet))  # type: ignore[arg-type]

    @api.middleware("http")
    async def ratchet_behind_login(request: Request, call_next: Any) -> Any:
        if request.url.path.startswith("/ratchet") and not request.session.get("user"):
            return RedirectResponse("/login")
        return await call_next(request)

    @api.post("/login")
    async def login(request: Request) -> dict[str, str]:
        request.session["user"] = "ops"
        return {"signed in": "ops"}

    api.add_middleware(SessionMiddleware, secret_key=SECRET)
    client = TestClient(api, follow_redirects=False)
    assert client.get("/ratchet/jobs").status_code == 307
    client.post("/login")
    page = client.get("/ratchet/jobs")
    assert page.status_code == 200 and job_id in page.text
    shown = [u for u in links(page.text) if u.startswith("/")]
    assert shown and all(u.startswith("/ratchet/") for u in shown), shown
    scraped = client.get("/ratchet/metrics")
    assert scraped.status_code == 200
    assert metrics_of(scraped.text)["ratchet_jobs[('queue', 'celery'), ('status', 'PENDING')]"] == 1
    assert client.post("/ratchet/jobs/cancel", data={"job_id": job_id}).status_code == 403
    [token] = set(CSRF.findall(page.text))
    form = {"job_id": job_id, "csrf": token, "confirmed": "yes"}
    done = client.post("/ratchet/jobs/cancel", data=form)
    assert done.status_code == 303 and done.headers["location"].startswith("/ratchet/")


# -- Django: a view of the project's, behind login_required ---------------------------------

DJANGO = textwrap.dedent(
    """
    import json, os, re
    from urllib.parse import urlencode

    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="the-application's-own-secret-key",
        ROOT_URLCONF="__main__",
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes",
                        "django.contrib.sessions"],
        MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware",
                    "django.middleware.csrf.CsrfViewMiddleware",
                    "django.contrib.auth.middleware.AuthenticationMiddleware"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        LOGIN_URL="/login/",
        USE_TZ=True,
    )
    django.setup()

    from django.contrib.auth.decorators import login_required
    from django.urls import re_path

    import celery_ratchet
    from celery_ratchet.contrib.django.dashboard import wsgi_view
    from celery_ratchet.web.guard import HostAllowlist

    app = celery_ratchet.Celery("shop")
    app.conf.ratchet_url = os.environ["STORE"]
    app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"
    ratchet = celery_ratchet.dashboard(
        app, secret=settings.SECRET_KEY,
        hosts=HostAllowlist(frozenset({"testserver"}), loopback=False),
    )
    urlpatterns = [re_path(r"^ratchet(?P<path>/.*)?$", login_required(wsgi_view(ratchet)))]

    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    job_id = app.send_task("t.add", args=(1, 2)).id
    client = Client(enforce_csrf_checks=True)
    found = {"anonymous": client.get("/ratchet/jobs").status_code}
    client.force_login(User.objects.create_user("ops"))
    page = client.get("/ratchet/jobs")
    html = page.content.decode()
    scraped = client.get("/ratchet/metrics")
    form = "application/x-www-form-urlencoded"  # as a browser posts the dashboard's forms
    bare = client.post("/ratchet/jobs/cancel", urlencode({"job_id": job_id}), form)
    token = re.findall(r'name="csrf" value="([^"]+)"', html)[0]
    fields = {"job_id": job_id, "csrf": token, "confirmed": "yes"}
    done = client.post("/ratchet/jobs/cancel", urlencode(fields), form)
    found.update(
        job_id=job_id,
        page=page.status_code,
        shows_job=job_id in html,
        links=re.findall(r'(?:href|action|src)="([^"]+)"', html),
        metrics=scraped.content.decode(),
        metrics_status=scraped.status_code,
        without_token=bare.status_code,
        with_token=done.status_code,
        location=done.headers.get("Location"),
        state=app.AsyncResult(job_id).state,
        prefix_alone=client.get("/ratchet").status_code,
    )
    print(json.dumps(found))
    """
)


def test_django_mount_serves_pages_and_metrics_under_its_prefix(tmp_path: Path) -> None:
    store = empty_store(f"sqlite:///{tmp_path / 'django.db'}")
    done = subprocess.run(
        [sys.executable, "-c", DJANGO],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "STORE": store.url, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["anonymous"] == 302, "not signed in: Django's login"
    assert found["page"] == 200 and found["shows_job"]
    shown = [u for u in found["links"] if u.startswith("/")]
    assert shown and all(u.startswith("/ratchet/") for u in shown), shown
    assert found["metrics_status"] == 200
    assert (
        metrics_of(found["metrics"])["ratchet_jobs[('queue', 'celery'), ('status', 'PENDING')]"]
        == 1
    )
    assert found["without_token"] == 403, "the dashboard's own CSRF check holds"
    assert found["with_token"] == 303 and found["location"].startswith("/ratchet/")
    assert found["state"] == JobStatus.REVOKED.value
    assert found["prefix_alone"] == 200


def test_a_secret_too_short_to_keep_a_token_unguessable_is_refused(app: Celery) -> None:
    with pytest.raises(celery_ratchet.ConfigurationError, match="16 characters"):
        celery_ratchet.dashboard(app, secret="short")
