"""What ``import celery_ratchet`` offers: every name it lists resolves, and every exception the
package raises can be caught by its name on the package."""

from __future__ import annotations

import inspect
import subprocess
import sys

import celery_ratchet
from celery_ratchet import errors


def test_every_exception_is_importable_from_the_package() -> None:
    raised = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.RatchetError)
    }
    assert {"StoreBusy", "InvalidJob", "TransactionRolledBack", "SchemaOutdated"} <= raised
    assert raised <= set(celery_ratchet.__all__)
    for name in raised:
        assert getattr(celery_ratchet, name) is getattr(errors, name)


def test_every_listed_name_resolves() -> None:
    for name in celery_ratchet.__all__:
        assert getattr(celery_ratchet, name) is not None, name


def test_importing_the_package_and_its_errors_does_not_import_celery() -> None:
    code = (
        "import sys, celery_ratchet; celery_ratchet.StoreBusy; "
        "print('celery' in sys.modules, 'sqlalchemy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
