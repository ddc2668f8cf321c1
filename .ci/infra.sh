#!/usr/bin/env bash
# CI: the private infrastructure the infra tests start themselves (marker `infra`): PgBouncer
# (tests/acceptance/test_pgbouncer.py), PostgreSQL server binaries with pg_basebackup
# (test_failover.py), MariaDB's Galera provider with rsync for state transfer
# (test_galera.py), and Quartz 2.3.2 with a JDK for the live cron comparison
# (tests/unit/test_cron_quartz.py), and Debian's chromium for the dashboard's and Flower's browser
# tests (tests/acceptance/test_web_browser.py, test_flower_browser.py; never a downloaded browser),
# and libfaketime for the clock skew tests (tests/acceptance/test_clock_skew.py).
# Idempotent: installs only what is missing, and never starts or reconfigures a system service.
# Under CI=true anything it cannot provide fails the run.
set -euo pipefail

missing=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
have pgbouncer || missing+=(pgbouncer)
have rsync || missing+=(rsync)
if ! ls /usr/lib/galera/libgalera_smm.so /usr/lib/libgalera_smm.so >/dev/null 2>&1; then
  missing+=(galera-4)
fi
[ -f /usr/share/java/quartz2.jar ] || missing+=(libquartz2-java)
{ have java && have javac; } || missing+=(default-jdk-headless)
[ -x /usr/bin/chromium ] || missing+=(chromium)
# libfaketime: nodes whose clocks are off (tests/acceptance/test_clock_skew.py, marker slow).
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing+=(faketime)

fail() {
  echo "infra: $*" >&2
  if [ "${CI:-}" = "true" ]; then exit 1; fi
  echo "infra: the tests that need it will be skipped (they fail under CI=true)" >&2
  exit 0
}

if [ "${#missing[@]}" -gt 0 ]; then
  echo "infra: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "not root and no sudo: cannot install ${missing[*]}"
    sudo="sudo"
  fi
  command -v apt-get >/dev/null 2>&1 || fail "no apt-get: install ${missing[*]} by hand"
  $sudo apt-get update -qq || fail "apt-get update failed"
  # No service starts during the install: the tests run their own on free ports.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || fail "apt-get install ${missing[*]} failed"
fi

have pgbouncer || fail "pgbouncer is still missing"
for tool in initdb pg_ctl pg_basebackup; do
  have "$tool" || ls /usr/lib/postgresql/*/bin/"$tool" >/dev/null 2>&1 \
    || fail "PostgreSQL's $tool is missing (package postgresql)"
done
have mariadbd || fail "mariadbd is missing (package mariadb-server)"
if ! mariadbd --verbose --help 2>/dev/null | grep -q '^wsrep-provider'; then
  fail "this mariadbd has no wsrep (Galera) support"
fi
[ -f /usr/share/java/quartz2.jar ] || fail "Quartz is still missing (package libquartz2-java)"
{ have java && have javac; } || fail "java/javac are missing (package default-jdk-headless)"
[ -x /usr/bin/chromium ] || fail "chromium is still missing (package chromium)"
have mariadb-install-db || fail "mariadb-install-db is missing (package mariadb-server)"
echo "infra: pgbouncer $(pgbouncer --version 2>/dev/null | head -1 | awk '{print $2}'), galera-4, Quartz, chromium, PostgreSQL and MariaDB binaries ready"
