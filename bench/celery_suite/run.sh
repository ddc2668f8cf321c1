#!/usr/bin/env bash
# Celery's own integration suite (t/integration of Celery's sdist) against celery_ratchet.
# Not part of ./dev test: it downloads Celery's sdist and runs its tests outside this repo.
#
#   bench/celery_suite/run.sh all                     the five below, one after another, and
#                                                     each ratchet run's differences from stock
#   bench/celery_suite/run.sh stock    [pytest args]  stock Celery, Redis broker + backend
#   bench/celery_suite/run.sh taskcls  [pytest args]  celery.Celery(task_cls="celery_ratchet:
#                                                     RatchetTask"), result_backend="ratchet://"
#   bench/celery_suite/run.sh ratchet  [pytest args]  celery_ratchet.Celery, ratchet:// backend
#   bench/celery_suite/run.sh taskcls-redisres | ratchet-redisres [pytest args]
#                                                     the same forms, Redis as result backend
# In the ratchet forms the broker URL is a closed port and the store a PostgreSQL database.
#
# Default tests: t/integration/test_tasks.py, test_canvas.py, test_inspect.py. Work files
# (Celery's sdist, a venv with this checkout installed editable, junit XML) go to
# $CELSUITE_WORK (default /tmp/celery_suite). The store is a fresh PostgreSQL database
# celsuite_<run> on $CELSUITE_PG (default postgres@127.0.0.1:5432); Redis on 127.0.0.1:6379
# db 0 (Celery's suite reads db 0 itself). Summary: python3 summary.py $CELSUITE_WORK/<run>.xml
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
WORK="${CELSUITE_WORK:-/tmp/celery_suite}"
PG="${CELSUITE_PG:-postgres@127.0.0.1:5432}"
run="${1:?name a run: all, stock, taskcls, ratchet, taskcls-redisres or ratchet-redisres}"; shift
mkdir -p "$WORK"
if [ "$run" = all ]; then  # one after another: stock and *-redisres share Redis db 0
  for one in stock taskcls ratchet taskcls-redisres ratchet-redisres; do
    "$0" "$one" "$@" >"$WORK/$one.log" 2>&1 || true
    tail -n 1 "$WORK/$one.log"
  done
  for one in taskcls ratchet taskcls-redisres ratchet-redisres; do
    python3 "$HERE/summary.py" "$WORK/$one.xml" \
      "$WORK/stock.xml"
  done
  exit 0
fi
PY="$WORK/venv/bin/python"
if [ ! -x "$PY" ]; then
  python3 -m venv "$WORK/venv"
  "$PY" -m pip install -q -e "$REPO[all,test]" pytest-timeout pytest-subtests pydantic
fi
version="$("$PY" -c 'import celery; print(celery.__version__)')"
SRC="$WORK/celery-$version"
if [ ! -d "$SRC/t/integration" ]; then
  "$PY" -m pip download -q --no-binary :all: --no-deps "celery==$version" -d "$WORK"
  tar xzf "$WORK/celery-$version.tar.gz" -C "$WORK"
fi
cp "$HERE/conftest.py" "$SRC/conftest.py"
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=(t/integration/test_tasks.py t/integration/test_canvas.py
                                 t/integration/test_inspect.py)
db="celsuite_${run//-/_}"
case "$run" in
  stock)    export CELSUITE_FORM=stock TEST_BROKER="redis://127.0.0.1:6379/0"
            export TEST_BACKEND="redis://127.0.0.1:6379/0" ;;
  taskcls|ratchet) export CELSUITE_FORM="$run" TEST_BACKEND="ratchet://" ;;
  taskcls-redisres|ratchet-redisres)
            export CELSUITE_FORM="${run%-redisres}" TEST_BACKEND="redis://127.0.0.1:6379/0" ;;
  *) echo "unknown run $run: stock, taskcls, ratchet, taskcls-redisres or ratchet-redisres" >&2
     exit 2 ;;
esac
if [ "$CELSUITE_FORM" != stock ]; then
  export TEST_BROKER="pyamqp://guest@127.0.0.1:1//"  # closed: nothing may reach a broker
  "$PY" - "$PG" "$db" <<'PY'
import sys
from sqlalchemy import create_engine, text
engine = create_engine(f"postgresql+psycopg://{sys.argv[1]}/postgres", isolation_level="AUTOCOMMIT")
with engine.connect() as conn:
    conn.execute(text(f'DROP DATABASE IF EXISTS "{sys.argv[2]}" WITH (FORCE)'))
    conn.execute(text(f'CREATE DATABASE "{sys.argv[2]}"'))
PY
  export RATCHET_URL="postgresql+psycopg://$PG/$db"
fi
cd "$SRC"
exec "$PY" -m pytest -p no:cacheprovider -p celery.contrib.pytest -o addopts="" -q -rfEs \
  --timeout="${CELSUITE_TIMEOUT:-60}" --junitxml="$WORK/$run.xml" "${tests[@]}"
