#!/usr/bin/env bash
# services.sh: make sure the databases the test suite needs are answering.
#
# Used by `make test` (and so by .ci/run, which runs `make test`): it is the
# whole set-up a newcomer needs. It also checks that the packages the Galera
# tests need are installed (they start their own cluster). For each of
# PostgreSQL and MariaDB:
#   - answering already        -> left alone (shared servers are never restarted);
#   - installed, not answering -> started with the distribution's own command, then waited for;
#   - not installed            -> stop at once, printing the one command that installs it.
# A server named by IDEM_TEST_PG_DSN / IDEM_TEST_MYSQL_DSN is the caller's: it is
# checked, never started.
set -euo pipefail

WAIT_SECONDS="${IDEM_SERVICES_WAIT:-60}"
PG_DEFAULT_DSN="postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
MY_HOST=127.0.0.1
MY_PORT=3306
MY_USER=root
MY_DB=test

say() { echo "services: $*"; }
die() { echo "services: $*" >&2; exit 1; }

wait_for() { # wait_for NAME CHECK...
	local name=$1; shift
	local i
	for ((i = 0; i < WAIT_SECONDS; i++)); do
		if "$@"; then return 0; fi
		sleep 1
	done
	die "$name did not answer within ${WAIT_SECONDS}s after starting it; see its log (PostgreSQL: /var/log/postgresql/, MariaDB: /var/log/mysql/error.log)"
}

# --- PostgreSQL ---------------------------------------------------------------
pg_dsn="${IDEM_TEST_PG_DSN:-$PG_DEFAULT_DSN}"
command -v pg_isready >/dev/null 2>&1 ||
	die "PostgreSQL is not installed. Install it with: apt-get install -y postgresql"
pg_up() { pg_isready -q -d "$pg_dsn" >/dev/null 2>&1; }
if ! pg_up; then
	if [ -n "${IDEM_TEST_PG_DSN:-}" ]; then
		die "PostgreSQL at IDEM_TEST_PG_DSN=$pg_dsn is not answering (it is yours to start; unset the variable to use the local server)"
	fi
	versions=$(ls /etc/postgresql 2>/dev/null || true)
	[ -n "$versions" ] && command -v pg_ctlcluster >/dev/null 2>&1 ||
		die "PostgreSQL server is not installed. Install it with: apt-get install -y postgresql"
	say "PostgreSQL is not answering on 127.0.0.1:5432; starting it"
	for v in $versions; do
		pg_ctlcluster --skip-systemctl-redirect "$v" main start || true
	done
	wait_for PostgreSQL pg_up
fi
if command -v psql >/dev/null 2>&1 && ! psql "$pg_dsn" -Atqc 'select 1' >/dev/null 2>&1; then
	die "PostgreSQL answers but ${pg_dsn} does not accept the tests' login. The tests expect user postgres with trust auth on 127.0.0.1 and a database named test (or set IDEM_TEST_PG_DSN). On Debian: add 'host all all 127.0.0.1/32 trust' to pg_hba.conf, reload, and run: su postgres -c 'createdb test'"
fi
say "PostgreSQL ok ($(pg_isready -d "$pg_dsn" 2>/dev/null | sed 's/ - .*//'))"

# --- MariaDB ------------------------------------------------------------------
if [ -n "${IDEM_TEST_MYSQL_DSN:-}" ]; then
	# go-sql-driver form: user[:pass]@tcp(host:port)/db?params
	addr=$(sed -n 's/.*@tcp(\([^)]*\)).*/\1/p' <<<"$IDEM_TEST_MYSQL_DSN")
	if [ -n "$addr" ]; then
		MY_HOST=${addr%:*}
		[ "$addr" != "$MY_HOST" ] && MY_PORT=${addr##*:}
	fi
fi
command -v mariadb-admin >/dev/null 2>&1 || command -v mysqladmin >/dev/null 2>&1 ||
	die "MariaDB is not installed. Install it with: apt-get install -y mariadb-server"
admin=$(command -v mariadb-admin || command -v mysqladmin)
# `ping` succeeds when the server answers, whatever the credentials.
my_up() { "$admin" --no-defaults --connect-timeout=2 -h "$MY_HOST" -P "$MY_PORT" ping >/dev/null 2>&1; }
if ! my_up; then
	if [ -n "${IDEM_TEST_MYSQL_DSN:-}" ]; then
		die "MariaDB/MySQL at IDEM_TEST_MYSQL_DSN ($MY_HOST:$MY_PORT) is not answering (it is yours to start; unset the variable to use the local server)"
	fi
	[ -x /usr/sbin/mariadbd ] ||
		die "MariaDB server is not installed. Install it with: apt-get install -y mariadb-server"
	say "MariaDB is not answering on $MY_HOST:$MY_PORT; starting it"
	# /run is a tmpfs in containers: the socket directory may be gone.
	if [ "$(id -u)" = 0 ] && [ ! -d /run/mysqld ]; then
		install -d -o mysql -g mysql /run/mysqld
	fi
	start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
	wait_for MariaDB my_up
fi
if [ -z "${IDEM_TEST_MYSQL_DSN:-}" ] && command -v mariadb >/dev/null 2>&1 &&
	! mariadb --no-defaults --connect-timeout=5 -h "$MY_HOST" -P "$MY_PORT" -u "$MY_USER" -e 'select 1' "$MY_DB" >/dev/null 2>&1; then
	die "MariaDB answers but root@$MY_HOST (no password) cannot use database $MY_DB, which the tests expect (or set IDEM_TEST_MYSQL_DSN). As root on this machine run: mariadb -e \"CREATE USER IF NOT EXISTS root@'127.0.0.1'; GRANT ALL ON *.* TO root@'127.0.0.1' WITH GRANT OPTION; CREATE DATABASE IF NOT EXISTS test\""
fi
say "MariaDB ok ($MY_HOST:$MY_PORT)"

# --- Galera -------------------------------------------------------------------
# tests/galera starts a throw-away three-node cluster (scripts/galera.sh)
# unless IDEM_TEST_GALERA_DSNS names one: check its packages now, not minutes
# into the run.
if [ -z "${IDEM_TEST_GALERA_DSNS:-}" ]; then
	[ -f "${IDEM_GALERA_PROVIDER:-/usr/lib/galera/libgalera_smm.so}" ] ||
		die "the Galera provider (for tests/galera) is not installed. Install it with: apt-get install -y galera-4 rsync"
	command -v rsync >/dev/null 2>&1 ||
		die "rsync (Galera's state transfer, for tests/galera) is not installed. Install it with: apt-get install -y rsync"
	command -v mariadb-install-db >/dev/null 2>&1 ||
		die "mariadb-install-db (for tests/galera) is missing. Install it with: apt-get install -y mariadb-server"
	say "Galera packages ok (tests/galera starts its own cluster)"
fi
