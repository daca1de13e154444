#!/usr/bin/env bash
# Make a local MariaDB usable by clusterd's tests:
#   1. installed   (apt-get, only as root and only when CI is set or
#                   CLUSTERD_INSTALL_MARIADB=1; otherwise fail loudly)
#   2. running     (ping; start mariadbd if needed; wait up to
#                   MARIADB_START_TIMEOUT seconds, default 60)
#   3. app user    clusterd/clusterd on 127.0.0.1 and localhost with ALL
#                   PRIVILEGES (tests create/drop clusterd_test_* databases),
#                   verified over TCP.
# Idempotent. Prints one "ready" line on success; errors go to stderr.
# Never changes root's authentication.
set -euo pipefail

APP_USER=clusterd
APP_PASS=clusterd
HOST=127.0.0.1
PORT=3306
DATADIR=/var/lib/mysql
RUNDIR=/run/mysqld
MARIADBD=/usr/sbin/mariadbd
START_TIMEOUT="${MARIADB_START_TIMEOUT:-60}"
# stdout/stderr of a mariadbd we start ourselves (the server's own error log
# is wherever the MariaDB config puts it, usually /var/log/mysql/error.log).
DAEMON_LOG="${CLUSTERD_MARIADB_LOG:-/var/tmp/clusterd-mariadbd.log}"

ERR_FILE="$(mktemp)"
trap 'rm -f "$ERR_FILE"' EXIT

log() { echo "mariadb-setup: $*" >&2; }
die() {
	echo "mariadb-setup: ERROR: $*" >&2
	exit 1
}
is_root() { [ "$(id -u)" -eq 0 ]; }

show_server_logs() {
	local f
	for f in "$DAEMON_LOG" /var/log/mysql/error.log; do
		if [ -s "$f" ]; then
			echo "----- last lines of $f -----" >&2
			tail -n 25 "$f" >&2 || true
		fi
	done
}

# --- 1. installed ------------------------------------------------------------
missing_bits() {
	local c
	for c in mariadb mariadb-admin mariadb-install-db; do
		command -v "$c" >/dev/null 2>&1 || echo "$c"
	done
	[ -x "$MARIADBD" ] || echo "$MARIADBD"
}

ensure_installed() {
	local missing
	missing="$(missing_bits)"
	[ -z "$missing" ] && return 0

	if is_root && { [ -n "${CI:-}" ] || [ "${CLUSTERD_INSTALL_MARIADB:-}" = 1 ]; }; then
		log "MariaDB not fully installed (missing: ${missing//$'\n'/ }); installing with apt-get"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >&2 || die "apt-get update failed"
		apt-get install -y -qq mariadb-server mariadb-client >&2 ||
			die "apt-get install mariadb-server mariadb-client failed"
		missing="$(missing_bits)"
		[ -z "$missing" ] || die "still missing after install: ${missing//$'\n'/ }"
		return 0
	fi

	cat >&2 <<-MSG
		##########################################################################
		mariadb-setup: WARNING: MariaDB is not installed on this machine.
		  missing: ${missing//$'\n'/ }
		  The MySQL/MariaDB half of the clusterd tests needs it.
		  Install it yourself:   sudo apt-get install -y mariadb-server mariadb-client
		  or let this script do it (as root):  CLUSTERD_INSTALL_MARIADB=1 $0
		##########################################################################
	MSG
	exit 1
}

# --- 2. running --------------------------------------------------------------
# mariadb-admin ping exits 0 whenever the server answers, even if access is
# denied, so this is a pure liveness check.
ping_server() {
	mariadb-admin --connect-timeout=2 ping >/dev/null 2>&1 ||
		mariadb-admin --connect-timeout=2 --protocol=tcp -h"$HOST" -P"$PORT" ping >/dev/null 2>&1
}

mariadbd_running() {
	start-stop-daemon --status --exec "$MARIADBD" >/dev/null 2>&1
}

ensure_running() {
	ping_server && return 0

	is_root || die "MariaDB is not answering and we are not root, so cannot start it (run: sudo $0)"
	command -v start-stop-daemon >/dev/null 2>&1 || die "start-stop-daemon not found; cannot start MariaDB"

	log "MariaDB not answering; starting $MARIADBD"
	install -d -m 0755 -o mysql -g mysql "$RUNDIR"
	if [ ! -d "$DATADIR/mysql" ]; then
		log "initialising data directory $DATADIR"
		mariadb-install-db --user=mysql --datadir="$DATADIR" >"$DAEMON_LOG" 2>&1 || {
			show_server_logs
			die "mariadb-install-db failed"
		}
	fi

	# --oknodo: a mariadbd that is already running (but not yet answering) is
	# left alone and we just wait for it.
	start-stop-daemon --start --oknodo --background --output "$DAEMON_LOG" \
		--exec "$MARIADBD" -- --user=mysql ||
		die "start-stop-daemon failed to start $MARIADBD"

	local waited=0
	until ping_server; do
		if [ "$waited" -ge "$START_TIMEOUT" ]; then
			show_server_logs
			die "MariaDB did not answer within ${START_TIMEOUT}s"
		fi
		# Give the fork a moment before concluding the server died on startup.
		if [ "$waited" -ge 3 ] && ! mariadbd_running; then
			show_server_logs
			die "mariadbd exited during startup"
		fi
		sleep 1
		waited=$((waited + 1))
	done
	log "MariaDB is up (after ~${waited}s)"
}

# --- 3. app user -------------------------------------------------------------
SETUP_SQL="
CREATE DATABASE IF NOT EXISTS test;
CREATE USER IF NOT EXISTS '${APP_USER}'@'127.0.0.1' IDENTIFIED BY '${APP_PASS}';
CREATE USER IF NOT EXISTS '${APP_USER}'@'localhost' IDENTIFIED BY '${APP_PASS}';
ALTER USER '${APP_USER}'@'127.0.0.1' IDENTIFIED BY '${APP_PASS}';
ALTER USER '${APP_USER}'@'localhost' IDENTIFIED BY '${APP_PASS}';
GRANT ALL PRIVILEGES ON *.* TO '${APP_USER}'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO '${APP_USER}'@'localhost' WITH GRANT OPTION;
"

ensure_app_user() {
	local err="$ERR_FILE"

	# Unix socket as OS root first: on a fresh Debian install root@localhost
	# uses unix_socket auth and is refused over TCP (error 1698). TCP root
	# with an empty password is the last resort.
	if mariadb -uroot --connect-timeout=5 -e "$SETUP_SQL" 2>"$err" </dev/null ||
		mariadb -uroot --protocol=socket --connect-timeout=5 -e "$SETUP_SQL" 2>>"$err" </dev/null ||
		mariadb -h"$HOST" -P"$PORT" --protocol=tcp -uroot --connect-timeout=5 -e "$SETUP_SQL" 2>>"$err" </dev/null; then
		:
	else
		cat "$err" >&2
		die "could not create ${APP_USER}@${HOST}: root login failed over the unix socket and over TCP"
	fi

	mariadb -h"$HOST" -P"$PORT" --protocol=tcp -u"$APP_USER" -p"$APP_PASS" \
		--connect-timeout=5 -e 'SELECT 1' >/dev/null 2>"$err" </dev/null || {
		cat "$err" >&2
		die "${APP_USER}@${HOST} cannot log in over TCP ${HOST}:${PORT}"
	}
}

ensure_installed
ensure_running
ensure_app_user
echo "mariadb-setup: ready, user ${APP_USER}@${HOST}"
