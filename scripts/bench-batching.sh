#!/usr/bin/env bash
# bench-batching.sh: pgstore's batching (on by default) against the same
# binary without it (-batching=false: pgstore.WithoutBatching), in one
# loadgen run (BENCHMARKS.md §3 and §4). Both servers run examples/payments
# without the step: loadgen's `idem` target gets `-steps=false
# -batching=false`, its `idem-nostep` target (already `-steps=false`) runs as
# shipped otherwise. The article's design is the control. Rows read:
#   "payments + idem (pgstore tx)"            -> no step, batching off
#   "payments + idem (pgstore tx), no step"   -> no step, batching on (as shipped)
#
#   scripts/bench-batching.sh [LOADGEN FLAGS...]
#   e.g. scripts/bench-batching.sh -requests 6000 -rounds 4 -warmup 300 -dups 0,30 -pool 16
#        scripts/bench-batching.sh -db-rtt 2ms -requests 3000 -rounds 3 -dups 0,30,90
#
# BENCH_BATCHING_AA=1 runs both targets with batching off (an A/A run: the
# spread it shows between two identical servers is the noise to read an
# on/off difference against).
#
# DSN as loadgen's (-dsn, default $IDEM_TEST_PG_DSN's local test database).
set -euo pipefail

# Called by loadgen as -payments-bin: pick the variant from the arguments.
if [ -n "${BENCH_BATCHING_PAYMENTS:-}" ]; then
  case " $* " in
  *" -steps=false "*) exec "$BENCH_BATCHING_PAYMENTS" "$@" ${BENCH_BATCHING_AA:+-batching=false} ;;
  *) exec "$BENCH_BATCHING_PAYMENTS" "$@" -steps=false -batching=false ;;
  esac
fi

root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$root"
go build -o "$dir/payments" ./examples/payments
export BENCH_BATCHING_PAYMENTS="$dir/payments"
go run ./examples/loadgen -payments-bin "$root/scripts/bench-batching.sh" \
  -provider-http -targets idem,idem-nostep,article -logs off "$@"
