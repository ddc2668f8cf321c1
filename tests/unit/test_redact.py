"""Credentials never leave in a message: each form a URL's password can take is masked."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_ratchet.settings import mask_password
from celery_ratchet.store.redact import mask_secrets_of, mask_url

SECRET = "s3cr3t"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cr3t@db:5432/shop", "postgresql://app:***@db:5432/shop"),
        ("postgresql://:s3cr3t@db/shop", "postgresql://:***@db/shop"),
        (
            "postgresql://app@db/shop?password=s3cr3t&sslmode=require",
            "postgresql://app@db/shop?password=***&sslmode=require",
        ),
        ("postgresql://app@db/shop?passwd=s3cr3t", "postgresql://app@db/shop?passwd=***"),
        (
            "postgresql://app:s3cr3t@db/shop?sslpassword=s3cr3t&sslkey=/k.pem",
            "postgresql://app:***@db/shop?sslpassword=***&sslkey=%2Fk.pem",
        ),
        ("postgresql://app@db/shop?auth_token=s3cr3t", "postgresql://app@db/shop?auth_token=***"),
        # Repeated query parameters, each masked.
        (
            "mysql://root@h/x?password=s3cr3t&password=s3cr3t",
            "mysql://root@h/x?password=***&password=***",
        ),
        # An unencoded @ (SQLAlchemy would read "ss" as part of the host).
        ("postgresql://app:s3c@r3t@db/shop", "postgresql://app:***@db/shop"),
        (
            "postgresql://app:s3c@r3t@db/shop?password=s3cr3t",
            "postgresql://app:***@db/shop?password=***",
        ),
        # Spaces, slashes, colons and question marks in the password.
        ("postgresql://app:s3cr3t and more@db/shop", "postgresql://app:***@db/shop"),
        ("postgresql://app:s3/cr:3t?x@db/shop", "postgresql://app:***@db/shop"),
        (
            "postgresql://app@db/shop?password=s3cr3t with spaces&sslmode=require",
            "postgresql://app@db/shop?password=***&sslmode=require",
        ),
        ("postgresql://app:s3%40cr3t@db/shop", "postgresql://app:***@db/shop"),
        # No scheme, or a broken one: still masked.
        ("app:s3cr3t@db/shop", "app:***@db/shop"),
        ("postgresql:/app:s3cr3t@db/shop", "postgresql:/app:***@db/shop"),
        ("db/shop?password=s3cr3t", "db/shop?password=***"),
        # Nothing secret: left exactly as given.
        ("sqlite:////tmp/a dir/ratchet.db", "sqlite:////tmp/a dir/ratchet.db"),
        ("mysql://root@127.0.0.1:3306/shop", "mysql://root@127.0.0.1:3306/shop"),
        ("redis://:s3cr3t@localhost:6379/0", "redis://:***@localhost:6379/0"),
    ],
)
def test_every_credential_of_a_url_is_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert SECRET not in mask_url(url) and "r3t" not in mask_url(url)


def test_free_text_keeps_each_url_and_masks_each_secret() -> None:
    text = (
        "cannot reach postgresql://app:s3c@r3t x@db/shop?password=s3cr3t (refused); "
        "theirs mysql://root:s3cr3t@h:3306/x; conninfo host=db password=s3cr3t dbname=shop "
        "token='s3cr3t s3cr3t'"
    )
    masked = mask_password(text)
    assert SECRET not in masked and "r3t" not in masked
    assert masked == (
        "cannot reach postgresql://app:***@db/shop?password=*** (refused); "
        "theirs mysql://root:***@h:3306/x; conninfo host=db password=*** dbname=shop "
        "token=***"
    )
    assert mask_password(masked) == masked  # masking twice changes nothing


def test_a_message_masked_once_keeps_its_text_when_masked_again() -> None:
    """MySQL names the user as 'root'@'host' after the URL: masking the masked message
    again must not hide everything up to that ``@``."""
    once = (
        f"cannot reach the job store at {mask_url('mysql://root:s3cr3t@127.0.0.1:3306/x')} "
        "((1045, \"Access denied for user 'root'@'127.0.0.1' (using password: YES)\"))"
    )
    assert "mysql://root:***@127.0.0.1:3306/x ((1045" in once
    assert mask_password(once) == once
    # A password that itself starts with the mask is still hidden whole.
    assert mask_password("mysql://u:***@s3cr3t@h/db x") == "mysql://u:***@h/db x"


def test_celery_report_and_conf_listings_mask_ratchet_urls() -> None:
    app = Celery("report", task_cls="celery_ratchet:RatchetTask", set_as_current=False)
    app.conf.update(
        ratchet_url="postgresql://app:s3cr3t@db/shop?sslpassword=s3cr3t",
        ratchet_events_url="redis://:s3cr3t@localhost:6379/0",
        ratchet_replica_url="app:s3cr3t@replica/shop",
        ratchet_poll_interval=0.5,
    )

    @app.task(name="report.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    app.finalize()  # binds the task: the app becomes a ratchet app
    table = app.conf.table(with_defaults=False)
    assert table["ratchet_url"] == "postgresql://app:***@db/shop?sslpassword=***"
    assert table["ratchet_events_url"] == "redis://:***@localhost:6379/0"
    assert table["ratchet_replica_url"] == "app:***@replica/shop"
    assert table["ratchet_poll_interval"] == 0.5
    report = app.bugreport()
    assert "ratchet_url" in report and SECRET not in report


def test_a_drivers_error_never_quotes_pieces_of_the_password() -> None:
    url = "postgresql://app:s3c@r3t and more@db:1/shop?sslpassword=k3y w0rd"
    # The unencoded @ made the driver take "r3t and more@db" for the host, and say so.
    reason = "failed to resolve host 'r3t and more@db': Name or service not known (k3y w0rd)"
    masked = mask_secrets_of(url, reason)
    for piece in ("s3c", "r3t and more", "k3y w0rd"):
        assert piece not in masked
    assert "Name or service not known" in masked
