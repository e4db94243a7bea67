#!/usr/bin/env bash
# galera.sh: a throw-away three-node MariaDB Galera cluster on loopback.
#
#   scripts/galera.sh run CMD [ARG...]   start the cluster, run CMD with the DSNs in the
#                                        environment, stop and remove everything; exit with CMD's status
#   scripts/galera.sh serve              start the cluster, print one line
#                                        IDEM_TEST_GALERA_DSNS=dsn1,dsn2,dsn3 on stdout, then keep it up
#                                        until stdin closes (the caller exits or dies) or a signal
#
# Everything lives in one temp directory (data, sockets, logs) and is removed on exit,
# on failure and on interrupt. Ports (IDEM_GALERA_PORT_BASE, default 15600): node i (1..3)
# serves SQL on BASE+6+i (15607-15609), group communication on BASE+10i+1, IST on
# BASE+10i+2, rsync SST on BASE+10i+3 (15611-15633).
#
# IDEM_GALERA_PROVIDER overrides the path of libgalera_smm.so (Debian's by default).
# For CMD the environment holds IDEM_TEST_GALERA_DSNS (three go-sql-driver DSNs,
# comma-separated, node order) and IDEM_TEST_GALERA_DSN1..3.
set -euo pipefail

mode=${1:-}
case "$mode" in
run) shift; [ $# -gt 0 ] || { echo "usage: $0 run CMD [ARG...]" >&2; exit 2; } ;;
serve) shift ;;
*) echo "usage: $0 run CMD [ARG...] | $0 serve" >&2; exit 2 ;;
esac

BASE=${IDEM_GALERA_PORT_BASE:-15600}
WAIT=${IDEM_GALERA_WAIT:-120}
PROVIDER=${IDEM_GALERA_PROVIDER:-/usr/lib/galera/libgalera_smm.so}
NODES=(1 2 3)

log() { echo "galera: $*" >&2; }
die() { echo "galera: $*" >&2; exit 1; }

[ -x /usr/sbin/mariadbd ] || die "MariaDB server is not installed. Install it with: apt-get install -y mariadb-server galera-4 rsync"
[ -f "$PROVIDER" ] || die "the Galera provider $PROVIDER is missing. Install it with: apt-get install -y galera-4"
command -v rsync >/dev/null 2>&1 || die "rsync (for SST) is missing. Install it with: apt-get install -y rsync"
command -v mariadb-install-db >/dev/null 2>&1 || die "mariadb-install-db is missing. Install it with: apt-get install -y mariadb-server"
client=$(command -v mariadb || command -v mysql) || die "the mariadb client is missing. Install it with: apt-get install -y mariadb-client"

sql_port() { echo $((BASE + 6 + $1)); }
gm_port() { echo $((BASE + 10 * $1 + 1)); }
ist_port() { echo $((BASE + 10 * $1 + 2)); }
sst_port() { echo $((BASE + 10 * $1 + 3)); }

for i in "${NODES[@]}"; do
	for p in $(sql_port "$i") $(gm_port "$i") $(ist_port "$i") $(sst_port "$i"); do
		if ss -Hltn "sport = :$p" 2>/dev/null | grep -q .; then
			die "port $p is in use (another Galera test cluster running?); set IDEM_GALERA_PORT_BASE to move the cluster"
		fi
	done
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-galera.XXXXXX")
pids=()

cleanup() {
	local rc=$?
	trap - EXIT INT TERM HUP
	for i in "${NODES[@]}"; do
		local pidf="$dir/node$i/mysqld.pid"
		[ -f "$pidf" ] && kill -TERM "$(cat "$pidf")" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	# A clean shutdown takes a second or two; don't wait forever for a wedged node.
	for _ in $(seq 1 30); do
		local alive=0
		for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
		[ $alive = 0 ] && break
		sleep 0.5
	done
	for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
	# SST may have left an rsync daemon behind (its pid file is in the data dir).
	for f in "$dir"/node*/data/rsync_sst.pid; do
		[ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null || true
	done
	if [ $rc -ne 0 ]; then
		for i in "${NODES[@]}"; do
			[ -f "$dir/node$i/error.log" ] || continue
			log "--- node$i error.log: errors ---"
			grep -E '\[ERROR\]|WSREP_SST: \[ERROR' "$dir/node$i/error.log" | head -n 20 >&2 || true
		done
	fi
	if [ -n "${IDEM_GALERA_KEEP:-}" ]; then
		log "IDEM_GALERA_KEEP is set: leaving $dir"
	else
		rm -rf "$dir"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

cluster_addr="gcomm://"
for i in "${NODES[@]}"; do
	cluster_addr+="127.0.0.1:$(gm_port "$i"),"
done
cluster_addr=${cluster_addr%,}

# As root, run the nodes as the mysql user: rsync's SST daemon, started by root, would
# drop to "nobody" and could not write the joiner's data directory.
user_opt=()
if [ "$(id -u)" = 0 ]; then
	id mysql >/dev/null 2>&1 || die "running as root needs the mysql user (created by the mariadb-server package)"
	user_opt=(--user=mysql)
	chmod 755 "$dir"
fi

for i in "${NODES[@]}"; do
	d="$dir/node$i"
	mkdir -p "$d/data" "$d/tmp"
	# One option file per node: mariadbd reads it, and so does the SST script it spawns.
	cat >"$d/my.cnf" <<CNF
[mysqld]
datadir=$d/data
tmpdir=$d/tmp
socket=$d/mysqld.sock
pid-file=$d/mysqld.pid
log-error=$d/error.log
port=$(sql_port "$i")
bind-address=127.0.0.1
skip-name-resolve
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
max-connections=300
innodb-buffer-pool-size=64M
innodb-log-file-size=32M
# Galera requirements
binlog-format=ROW
default-storage-engine=InnoDB
innodb-autoinc-lock-mode=2
# Durability comes from the cluster (a commit is replicated before it returns);
# the usual Galera setting, and it keeps a shared test machine's disk quiet.
innodb-flush-log-at-trx-commit=2
wsrep-on=ON
wsrep-provider=$PROVIDER
wsrep-cluster-name=idem-galera-test
wsrep-cluster-address=$cluster_addr
wsrep-node-name=node$i
wsrep-node-address=127.0.0.1
wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:$(gm_port "$i");ist.recv_addr=127.0.0.1:$(ist_port "$i");gcache.size=64M;evs.inactive_timeout=PT5S;evs.suspect_timeout=PT3S;pc.wait_prim_timeout=PT30S
wsrep-sst-method=rsync
wsrep-sst-receive-address=127.0.0.1:$(sst_port "$i")
wsrep-slave-threads=2
CNF
	[ "$(id -u)" = 0 ] && chown -R mysql:mysql "$d"
done

t0=$(date +%s)
log "initialising three data directories in $dir"
init_pids=()
for i in "${NODES[@]}"; do
	d="$dir/node$i"
	mariadb-install-db --defaults-file="$d/my.cnf" "${user_opt[@]}" --wsrep-on=OFF \
		--auth-root-authentication-method=normal --skip-test-db >"$d/install.log" 2>&1 &
	init_pids+=($!)
done
for n in "${!init_pids[@]}"; do
	wait "${init_pids[$n]}" || { cat "$dir/node$((n + 1))/install.log" >&2; die "mariadb-install-db failed for node$((n + 1))"; }
done

ping_node() { "$client" --no-defaults --connect-timeout=2 -h127.0.0.1 -P "$(sql_port "$1")" -uroot -Nse "$2" 2>/dev/null; }

start_node() { # start_node I [EXTRA...]
	local i=$1; shift
	/usr/sbin/mariadbd --defaults-file="$dir/node$i/my.cnf" "${user_opt[@]}" "$@" >>"$dir/node$i/stdout.log" 2>&1 &
	pids[i - 1]=$!
}

wait_ready() { # wait_ready I: the node answers SQL, is synced with the cluster and ready for clients
	local i=$1 s=0
	while [ $s -lt $((WAIT * 2)) ]; do
		kill -0 "${pids[$((i - 1))]}" 2>/dev/null || return 1
		# Synced alone is not enough: a node can report it while wsrep_ready is
		# still OFF, and then refuses statements (1047 "WSREP has not yet
		# prepared node for application use"), as a test saw right after start.
		if [ "$(ping_node "$i" "select group_concat(variable_value order by variable_name) from information_schema.global_status where variable_name in ('wsrep_local_state_comment', 'wsrep_ready')")" = "Synced,ON" ]; then
			return 0
		fi
		sleep 0.5
		s=$((s + 1))
	done
	die "node$i was not Synced within ${WAIT}s"
}

log "starting node1 (bootstrap, SQL port $(sql_port 1))"
join() { # join I: wait for a joiner; one whose state transfer failed (a loaded machine) gets a second try
	wait_ready "$1" && return 0
	log "node$1 exited during start-up; starting it once more"
	start_node "$1"
	wait_ready "$1" || die "node$1 exited during start-up, twice"
}

start_node 1 --wsrep-new-cluster
wait_ready 1 || die "node1 exited during start-up"
# The shared servers give root@127.0.0.1 no password and a database named test; so does the cluster.
ping_node 1 "create database if not exists test" >/dev/null
log "starting node2 and node3 (rsync SST)"
start_node 2
start_node 3
join 2
join 3
# A donor (node1 gives each joiner its state by rsync) is desynced while it
# donates: every node must be back to Synced and ready before tests start.
for i in "${NODES[@]}"; do
	wait_ready "$i" || die "node$i exited after the cluster formed"
done
size=$(ping_node 1 "select variable_value from information_schema.global_status where variable_name='wsrep_cluster_size'")
[ "$size" = 3 ] || die "wsrep_cluster_size is $size, want 3"
log "cluster of $size nodes formed in $(($(date +%s) - t0))s"

dsns=()
for i in "${NODES[@]}"; do
	dsns+=("root@tcp(127.0.0.1:$(sql_port "$i"))/test")
	export "IDEM_TEST_GALERA_DSN$i=${dsns[$((i - 1))]}"
done
IDEM_TEST_GALERA_DSNS=$(
	IFS=,
	echo "${dsns[*]}"
)
export IDEM_TEST_GALERA_DSNS

case "$mode" in
run)
	set +e
	"$@"
	rc=$?
	set -e
	exit $rc
	;;
serve)
	echo "IDEM_TEST_GALERA_DSNS=$IDEM_TEST_GALERA_DSNS"
	# Up until the caller closes our stdin (it exited, or died) or signals us.
	cat >/dev/null || true
	;;
esac
