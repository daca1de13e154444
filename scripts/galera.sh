#!/usr/bin/env bash
# A 3-node MariaDB Galera cluster on loopback, from Debian's packages
# (mariadb-server, galera-4, rsync), for tests and for people.
#
#   scripts/galera.sh start        install what is missing, create the nodes if
#                                  needed, start all three, wait for a primary
#                                  component of 3 synced nodes
#   scripts/galera.sh stop         stop every node cleanly
#   scripts/galera.sh status       each node's wsrep state
#   scripts/galera.sh dsn N        the DSN of node N (1-3) for clusterd
#   scripts/galera.sh kill N       SIGKILL node N (fault injection)
#   scripts/galera.sh start-node N start node N again and wait until it is
#                                  synced in a primary component (a node that
#                                  lost its peers regains one once enough of
#                                  them are back: start those together)
#   scripts/galera.sh destroy      stop and delete every node's data
#
# Nodes listen on 127.0.0.1: with GALERA_PORT=P (default 4306), SQL on P+N,
# group communication on P+10260+2N, IST on P+10261+2N, SST on P+10267+N
# (P+10262..P+10270 in all), so clusters with other GALERA_PORT (100 apart
# or more) and GALERA_DIR can run side by side (tests
# that kill nodes start their own). Data lives under GALERA_DIR (default
# /tmp/clusterd-galera), owned by the mysql user: the rsync
# SST daemon runs as mysql and cannot read root-owned data directories. Every
# mariadbd runs with --no-defaults, so the machine's own MariaDB
# configuration (and server on 3306) is untouched.
#
# Known pitfalls handled here: mariadb-install-db needs --no-defaults (else it
# reads /etc/mysql and its port and socket); joiners are seeded from a copy of
# the first node's data taken after a clean stop (same cluster id, users and
# schema), and only that node may bootstrap; a restarted node rejoins by IST
# when the others' gcache still holds what it missed, else by rsync SST (a
# killed node first recovers its position: start_position).
# Measured here: create and start 12 s, stop 6 s, start again 9 s, a killed
# node back in 12 s.
set -euo pipefail

dir="${GALERA_DIR:-/tmp/clusterd-galera}"
base_port="${GALERA_PORT:-4306}"
provider=/usr/lib/galera/libgalera_smm.so
user=clusterd
password=clusterd

sql_port() { echo $((base_port + $1)); }
gcomm_port() { echo $((base_port + 10260 + 2 * $1)); }
ist_port() { echo $((base_port + 10261 + 2 * $1)); }
sst_port() { echo $((base_port + 10267 + $1)); }
data() { echo "$dir/node$1"; }
sock() { echo "$(data "$1")/mysqld.sock"; }
# tmpd is node N's own directory for temporary files (not the shared /tmp,
# where a bootstrap's temporary tables were once lost beside other servers).
tmpd() { echo "$dir/tmp$1"; }
log() { echo "galera: $*" >&2; }

install() {
	local missing=()
	[ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
	[ -f "$provider" ] || missing+=(galera-4)
	command -v rsync >/dev/null || missing+=(rsync)
	if [ "${#missing[@]}" -gt 0 ]; then
		log "installing ${missing[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
	fi
}

cluster_address() {
	echo "gcomm://127.0.0.1:$(gcomm_port 1),127.0.0.1:$(gcomm_port 2),127.0.0.1:$(gcomm_port 3)"
}

# node_args N sets args to node N's mariadbd flags.
node_args() {
	local n=$1 d
	d="$(data "$n")"
	args=(--no-defaults --user=mysql --datadir="$d" --tmpdir="$(tmpd "$n")" --socket="$(sock "$n")" --port="$(sql_port "$n")"
		--bind-address=127.0.0.1 --pid-file="$d/mysqld.pid" --log-error="$d/error.log"
		--skip-name-resolve --binlog-format=ROW --default-storage-engine=InnoDB
		--innodb-autoinc-lock-mode=2 --innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=2
		--wsrep-on=ON --wsrep-provider="$provider" --wsrep-cluster-name=clusterd-test
		--wsrep-cluster-address="$(cluster_address)" --wsrep-node-name="node$n"
		--wsrep-node-address="127.0.0.1:$(gcomm_port "$n")"
		--wsrep-provider-options="gmcast.listen_addr=tcp://127.0.0.1:$(gcomm_port "$n");ist.recv_addr=127.0.0.1:$(ist_port "$n");gcache.size=128M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT6S"
		--wsrep-sst-method=rsync --wsrep-sst-receive-address="127.0.0.1:$(sst_port "$n")"
		--wsrep-slave-threads=2)
}

# run_node N [extra mariadbd flags...] starts node N in the background.
run_node() {
	local n=$1 args
	shift
	command install -d -o mysql -g mysql "$(tmpd "$n")"
	node_args "$n"
	setsid /usr/sbin/mariadbd "${args[@]}" "$@" </dev/null >/dev/null 2>&1 &
}

# start_position N prints node N's --wsrep-start-position when it stopped
# without a clean shutdown (a kill leaves seqno -1 in grastate.dat): the
# position InnoDB recovered (mariadbd --wsrep-recover, as galera_recovery
# does for systemd). Without it the node rejoins by a full rsync SST, which
# copies every file and blocks writes on its donor while it runs, however
# little it missed; with it, by IST from the others' gcache.
start_position() {
	local n=$1 d pos args
	d="$(data "$n")"
	grep -q '^seqno: *-1' "$d/grastate.dat" 2>/dev/null || return 0
	rm -f "$d/recover.log"
	node_args "$n"
	/usr/sbin/mariadbd "${args[@]}" --skip-networking --socket="$d/recover.sock" --pid-file="$d/recover.pid" \
		--log-error="$d/recover.log" --wsrep-recover </dev/null >/dev/null 2>&1 || true
	pos="$(grep -a 'WSREP: Recovered position:' "$d/recover.log" 2>/dev/null | tail -1 | sed 's/.*Recovered position: *//' || true)"
	if [ -n "$pos" ]; then
		echo "--wsrep-start-position=$pos"
	else
		log "node $n: no position recovered (it rejoins by SST); the recovery's log:"
		tail -10 "$d/recover.log" >&2 2>/dev/null || true
	fi
}

client() {
	local n=$1
	shift
	mariadb --no-defaults --protocol=socket --socket="$(sock "$n")" -uroot -N -B "$@"
}

# wait_sql N waits until node N answers SQL (up to 90s).
wait_sql() {
	local n=$1
	for _ in $(seq 900); do
		if client "$n" -e 'SELECT 1' >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.1
	done
	log "node $n does not answer; its log:"
	tail -30 "$(data "$n")/error.log" >&2
	return 1
}

status_var() { client "$1" -e "SHOW STATUS LIKE '$2'" 2>/dev/null | awk '{print $2}'; }

# wait_synced N [SIZE] waits until node N is Synced in a primary component
# (of SIZE nodes, when given).
wait_synced() {
	local n=$1 size=${2:-}
	for _ in $(seq 900); do
		if [ "$(status_var "$n" wsrep_local_state_comment)" = Synced ] &&
			[ "$(status_var "$n" wsrep_cluster_status)" = Primary ] &&
			{ [ -z "$size" ] || [ "$(status_var "$n" wsrep_cluster_size)" = "$size" ]; }; then
			return 0
		fi
		sleep 0.1
	done
	log "node $n is not synced in a primary component${size:+ of $size}; its log:"
	tail -30 "$(data "$n")/error.log" >&2
	return 1
}

# alive PID says whether process PID runs (a zombie, killed and not yet
# reaped, does not). Its state is read once: a process that exits while it
# is read has no state line, and is not alive.
alive() {
	local state
	state="$(grep -m1 '^State:' "/proc/$1/status" 2>/dev/null)" || return 1
	[[ $state != State:*[[:space:]][ZX]* ]]
}

stop_node() {
	local n=$1 pid
	[ -f "$(data "$n")/mysqld.pid" ] || return 0
	pid="$(cat "$(data "$n")/mysqld.pid" 2>/dev/null || true)"
	[ -n "$pid" ] || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for _ in $(seq 600); do
		alive "$pid" || return 0
		sleep 0.1
	done
	log "node $n did not stop within 60s; killing it"
	kill -KILL "$pid" 2>/dev/null || true
}

running() {
	local pid
	pid="$(cat "$(data "$1")/mysqld.pid" 2>/dev/null || true)"
	[ -n "$pid" ] && alive "$pid"
}

create() {
	log "creating three nodes under $dir"
	mkdir -p "$dir"
	chmod 755 "$dir"
	chown mysql:mysql "$dir"
	local d1
	d1="$(data 1)"
	rm -rf "$d1"
	command install -d -o mysql -g mysql "$d1"
	command install -d -o mysql -g mysql "$(tmpd 1)"
	mariadb-install-db --no-defaults --user=mysql --datadir="$d1" --tmpdir="$(tmpd 1)" --auth-root-authentication-method=socket \
		--skip-test-db >"$dir/install.log" 2>&1 || {
		cat "$dir/install.log" >&2
		return 1
	}
	run_node 1 --wsrep-new-cluster
	wait_sql 1
	client 1 -e "CREATE USER IF NOT EXISTS '$user'@'127.0.0.1' IDENTIFIED BY '$password';
		GRANT ALL ON *.* TO '$user'@'127.0.0.1'; CREATE DATABASE IF NOT EXISTS test;"
	# A clean stop, then copies: the joiners start from node 1's exact state
	# (same cluster state id and seqno) and join by IST.
	stop_node 1
	for n in 2 3; do
		rm -rf "$(data "$n")"
		cp -a "$d1" "$(data "$n")"
		rm -f "$(data "$n")/mysqld.pid" "$(data "$n")/error.log"
		# Only the node that bootstraps may; the copies must join.
		sed -i 's/^safe_to_bootstrap: 1/safe_to_bootstrap: 0/' "$(data "$n")/grastate.dat"
	done
}

start() {
	install
	[ "$(id -u)" -eq 0 ] || {
		log "must run as root (the nodes run as the mysql user)"
		exit 1
	}
	[ -d "$(data 3)" ] || create
	if ! running 1 && ! running 2 && ! running 3; then
		# Bootstrap from the node that stopped last (safe_to_bootstrap: 1).
		local first=1
		for n in 1 2 3; do
			if grep -q '^safe_to_bootstrap: 1' "$(data "$n")/grastate.dat" 2>/dev/null; then
				first=$n
			fi
		done
		run_node "$first" --wsrep-new-cluster
		wait_sql "$first"
	fi
	for n in 1 2 3; do
		# shellcheck disable=SC2046 # the position is one word, or none
		running "$n" || run_node "$n" $(start_position "$n")
	done
	for n in 1 2 3; do
		wait_sql "$n"
		wait_synced "$n" 3
	done
	log "3 nodes synced: $(for n in 1 2 3; do printf '%s ' "$(dsn "$n")"; done)"
}

stop() {
	# Joiners first, so the last to stop can bootstrap the next start.
	for n in 3 2 1; do
		stop_node "$n"
	done
	# A node still starting has no pid file yet: its data folder names it.
	for n in 1 2 3; do
		pkill -KILL -f -- "--datadir=$(data "$n") " 2>/dev/null || true
	done
}

dsn() { echo "mysql://$user:$password@127.0.0.1:$(sql_port "$1")/test"; }

status() {
	for n in 1 2 3; do
		if running "$n"; then
			echo "node$n $(dsn "$n") $(status_var "$n" wsrep_local_state_comment) $(status_var "$n" wsrep_cluster_status) size=$(status_var "$n" wsrep_cluster_size)"
		else
			echo "node$n stopped"
		fi
	done
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
dsn) dsn "${2:?node number}" ;;
kill)
	n="${2:?node number}"
	pid="$(cat "$(data "$n")/mysqld.pid")"
	kill -KILL "$pid"
	# Gone before this returns: a node started again at once must not
	# meet the dying one's ports and InnoDB file locks.
	for _ in $(seq 300); do
		alive "$pid" || exit 0
		sleep 0.1
	done
	log "node $n (pid $pid) still there 30s after SIGKILL"
	exit 1
	;;
start-node)
	n="${2:?node number}"
	# shellcheck disable=SC2046 # the position is one word, or none
	run_node "$n" $(start_position "$n")
	wait_sql "$n"
	wait_synced "$n"
	;;
destroy)
	stop
	rm -rf "$dir"
	;;
*)
	sed -n '2,20p' "$0" >&2
	exit 2
	;;
esac
