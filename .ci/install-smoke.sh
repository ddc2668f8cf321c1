#!/usr/bin/env bash
# Install smoke test: build the wheel, install it into a bare venv per extra (no test tools),
# and run from that venv what a new user runs first: examples/quickstart.py, and for the
# redis extra a `-E` events worker with ratchet_events_url set. Any error fails the script.
#   .ci/install-smoke.sh            PYTHON=python3.10 .ci/install-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
PYTHON="${PYTHON:-python3}"
PG="${RATCHET_TEST_PG:-postgres@127.0.0.1:5432}"
MYSQL="${RATCHET_TEST_MYSQL:-root@127.0.0.1:3306}"
REDIS="${RATCHET_SMOKE_REDIS:-redis://127.0.0.1:6379/13}"
db="ratchet_smoke$$"
work="$(mktemp -d /tmp/ratchet-smoke.XXXXXX)"

pg_admin() { psql -X -q -v ON_ERROR_STOP=1 "postgresql://$PG/postgres" -c "$1"; }
my_admin() {
  local user="${MYSQL%@*}" hostport="${MYSQL#*@}"
  mysql -u "$user" -h "${hostport%:*}" -P "${hostport#*:}" -e "$1"
}
cleanup() {
  local rc=$?
  pg_admin "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  my_admin "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
  rm -rf "$work"
  if [ "$rc" -ne 0 ]; then echo "install smoke FAILED (exit $rc)" >&2; fi
  exit "$rc"
}
trap cleanup EXIT

started=$(date +%s)
echo "install smoke: building the wheel with $("$PYTHON" --version)"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$root"
wheel="$(ls "$work"/dist/celery_ratchet-*.whl)"
pg_admin "DROP DATABASE IF EXISTS $db WITH (FORCE)"
pg_admin "CREATE DATABASE $db"
my_admin "DROP DATABASE IF EXISTS $db; CREATE DATABASE $db CHARACTER SET utf8mb4"

# extra | job store for the quickstart | events worker?
for spec in "none|sqlite|no" "postgres|postgresql://$PG/$db|no" "mysql|mysql://$MYSQL/$db|no" \
            "redis|sqlite|yes" "postgres,redis|postgresql://$PG/$db|yes" "web|sqlite|no" \
            "web,metrics|sqlite|no"; do
  IFS='|' read -r extra store events <<<"$spec"
  name="${extra//,/-}"
  venv="$work/venv-$name"
  run="$work/run-$name"
  mkdir -p "$run"
  label="celery-ratchet"
  [ "$extra" = none ] || label="celery-ratchet[$extra]"
  echo "--- a bare venv: pip install $label"
  "$PYTHON" -m venv "$venv"
  target="$wheel"
  [ "$extra" = none ] || target="$wheel[$extra]"
  if ! "$venv/bin/python" -m pip install --quiet "$target" >"$run/pip.log" 2>&1; then
    cat "$run/pip.log" >&2
    exit 1
  fi
  # The installed package, not this checkout, is what runs.
  (cd "$run" && "$venv/bin/python" -c "import celery_ratchet, sys; \
    assert sys.prefix in celery_ratchet.__file__, celery_ratchet.__file__")
  env_url=()
  if [ "$store" != sqlite ]; then env_url=(RATCHET_URL="$store"); fi
  (cd "$run" && env "${env_url[@]}" "$venv/bin/python" "$root/examples/quickstart.py") \
    >"$run/quickstart.log" 2>&1 || { cat "$run/quickstart.log" >&2; exit 1; }
  grep -q "add(2, 3)       = 5" "$run/quickstart.log" || { cat "$run/quickstart.log" >&2; exit 1; }
  echo "    quickstart on ${store%%:*}: ok"
  case "$extra" in
    none) (cd "$run" && "$venv/bin/python" "$root/.ci/smoke_web.py" bare) ;;
    web|web,metrics) (cd "$run" && "$venv/bin/python" "$root/.ci/smoke_web.py" with-extra) ;;
  esac
  if [ "$events" = yes ]; then
    store_url="$store"
    [ "$store" = sqlite ] && store_url="sqlite:///$run/events.db"
    (cd "$run" && RATCHET_URL="$store_url" RATCHET_EVENTS_URL="$REDIS" \
      "$venv/bin/python" "$root/.ci/smoke_events.py")
  fi
done
echo "install smoke: passed in $(( $(date +%s) - started )) s"
