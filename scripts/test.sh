#!/usr/bin/env bash
# Runs the Go tests (with -race) and shows what matters: package results,
# failures in full, the tests' own log lines, and how many subtests ran on
# each database backend, so a run that silently skipped MariaDB is visible.
set -uo pipefail
log="$(mktemp)"
galera_log="$(mktemp)"
galera_started=""
cleanup() {
	rm -f "$log" "$galera_log"
	if [ -n "$galera_started" ]; then
		if [ -n "${GALERA_KEEP:-}" ]; then
			echo "galera: kept running in $GALERA_DIR (GALERA_PORT=$GALERA_PORT)"
		else
			bash scripts/galera.sh destroy >/dev/null 2>&1 || true
		fi
	fi
	# A test binary that go test's -timeout ended (a panic) ran no
	# t.Cleanup, so the private Galera clusters of its e2e tests
	# (/tmp/clusterd-galera-<test>-<pid>) outlive it. Those of a process
	# that is gone are destroyed here; another run's live ones are left.
	local d pid
	for d in /tmp/clusterd-galera-*-[0-9]*; do
		[ -d "$d" ] || continue
		pid="${d##*-}"
		[[ "$pid" =~ ^[0-9]+$ ]] || continue
		kill -0 "$pid" 2>/dev/null && continue
		GALERA_DIR="$d" bash scripts/galera.sh destroy >/dev/null 2>&1 || true
	done
	# The same for TestImage's containers (clusterd-test-<pid>-<n>, with
	# their volumes) and images (clusterd-test:<pid>-<n>).
	if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
		local name
		for name in $(docker ps -a --format '{{.Names}}' | grep '^clusterd-test-[0-9]*-'); do
			pid="${name#clusterd-test-}"; pid="${pid%%-*}"
			kill -0 "$pid" 2>/dev/null || docker rm -f -v "$name" >/dev/null 2>&1 || true
		done
		for name in $(docker volume ls -q | grep '^clusterd-test-[0-9]*-'); do
			pid="${name#clusterd-test-}"; pid="${pid%%-*}"
			kill -0 "$pid" 2>/dev/null || docker volume rm -f "$name" >/dev/null 2>&1 || true
		done
		for name in $(docker images --format '{{.Repository}}:{{.Tag}}' | grep '^clusterd-test:[0-9]*-'); do
			pid="${name#clusterd-test:}"; pid="${pid%%-*}"
			kill -0 "$pid" 2>/dev/null || docker rmi -f "$name" >/dev/null 2>&1 || true
		done
	fi
}
trap cleanup EXIT

# free_galera_port prints a GALERA_PORT whose every port (see
# scripts/galera.sh) nothing listens on, starting at a random base.
free_galera_port() {
	local i base p busy
	for i in $(seq 0 49); do
		base=$((10306 + 100 * ((RANDOM + i) % 50)))
		busy=""
		for p in $((base + 1)) $((base + 2)) $((base + 3)) \
			$((base + 10262)) $((base + 10263)) $((base + 10264)) $((base + 10265)) $((base + 10266)) $((base + 10267)) \
			$((base + 10268)) $((base + 10269)) $((base + 10270)); do
			if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
				busy=1
				break
			fi
		done
		if [ -z "$busy" ]; then
			echo "$base"
			return 0
		fi
	done
	return 1
}

# A 3-node MariaDB Galera cluster on loopback for the multi-primary tests
# (repository on Galera, cross-node races), of this run's own (its data
# folder and ports), so that two make test runs on one machine never share
# one, nor stop each other's. Without it they are skipped with a banner (or
# fail under CI).
if [ -z "${CLUSTERD_TEST_GALERA_DSNS:-}" ]; then
	# A second try on other ports: another run on this machine may take the
	# ports between the probe and the start, and a loaded machine has once
	# left a node unsynced past the script's wait.
	galera_ok=""
	for try in 1 2; do
		GALERA_DIR="$(mktemp -d /tmp/clusterd-galera-test.XXXXXX)"
		GALERA_PORT="$(free_galera_port || echo 4306)"
		export GALERA_DIR GALERA_PORT
		if bash scripts/galera.sh start >"$galera_log" 2>&1; then
			galera_ok=1
			break
		fi
		if [ "$try" -eq 1 ]; then
			echo "!! scripts/galera.sh start failed on GALERA_PORT=$GALERA_PORT; trying other ports:"
			tail -n 5 "$galera_log"
			bash scripts/galera.sh destroy >/dev/null 2>&1 || true
		fi
	done
	if [ -n "$galera_ok" ]; then
		galera_started=1
		CLUSTERD_TEST_GALERA_DSNS="$(for n in 1 2 3; do bash scripts/galera.sh dsn "$n"; done | paste -sd,)"
		export CLUSTERD_TEST_GALERA_DSNS
		echo "galera: 3 nodes on loopback ($CLUSTERD_TEST_GALERA_DSNS)"
	else
		galera_started=1 # destroy what it made of the cluster
		echo "!! scripts/galera.sh could not start the Galera cluster; the Galera tests will be skipped (or fail under CI):"
		tail -n 20 "$galera_log"
	fi
fi

# A package's tests may take several times longer on a busy machine (the
# server and repository packages took 9 minutes beside another make test);
# the timeout is a deadline for a hung test, not a speed goal.
go test -race -count=1 -timeout "${TEST_TIMEOUT:-45m}" -v "$@" >"$log" 2>&1
rc=$?

if [ "$rc" -ne 0 ]; then
	# A failure: everything, logs included.
	cat "$log"
else
	# Success: package results and the tests' own t.Log lines, without the
	# per-test RUN/PASS chatter and the servers' structured logs.
	grep -vE '^[[:space:]]*(=== (RUN|PAUSE|CONT|NAME)|--- PASS|--- SKIP|PASS$|time=)' "$log"
fi

# On a failure, end with what failed, so that the last lines of a long log
# (all that some CI views keep) name the failed tests, their last message
# lines and the failed packages.
if [ "$rc" -ne 0 ]; then
	echo
	echo "== failed tests (with the last lines each logged):"
	awk '
		/^[[:space:]]*=== (RUN|CONT|NAME)[[:space:]]/ { cur = $3; next }
		# A harness dumps the server logs of a failed test ("log of ...") as it
		# cleans up, after the lines that say what failed: keep those.
		/^[[:space:]]+[^ ]+\.go:[0-9]+: log of / { next }
		/^[[:space:]]+[^ ]+\.go:[0-9]+: / && cur != "" {
			n = ++cnt[cur]; buf[cur, n] = $0; next
		}
		/^[[:space:]]*--- FAIL: / {
			print
			name = $3
			from = cnt[name] > 4 ? cnt[name] - 3 : 1
			for (i = from; i <= cnt[name]; i++) print "    " buf[name, i]
		}
	' "$log" | head -n 60
	grep -E '^(FAIL[[:space:]]|panic:|fatal error:|WARNING: DATA RACE)' "$log" | sort | uniq -c | head -n 30
fi

count() { grep -cE "^[[:space:]]*--- $1: [^ ]+/$2( |/)" "$log"; }
sqlite_pass=$(count PASS sqlite); mysql_pass=$(count PASS mysql); galera_pass=$(count PASS galera)
sqlite_fail=$(count FAIL sqlite); mysql_fail=$(count FAIL mysql); galera_fail=$(count FAIL galera)
echo
echo "backends: sqlite ${sqlite_pass} subtests passed, ${sqlite_fail} failed; mysql (MariaDB) ${mysql_pass} passed, ${mysql_fail} failed; galera ${galera_pass} passed, ${galera_fail} failed"
if grep -q 'is unreachable' "$log"; then
	echo "WARNING: the MariaDB half of the tests was skipped (see the banner above)"
fi
if grep -q 'Galera is not available' "$log"; then
	echo "WARNING: the Galera tests were skipped (see the banner above)"
fi
if [ "$rc" -eq 0 ] && [ -n "${CI:-}" ] && [ "$mysql_pass" -eq 0 ]; then
	echo "FAIL: CI run without a single MariaDB subtest" >&2
	rc=1
fi
if [ "$rc" -eq 0 ] && [ -n "${CI:-}" ] && [ "$galera_pass" -eq 0 ]; then
	echo "FAIL: CI run without a single Galera subtest" >&2
	rc=1
fi
exit "$rc"
