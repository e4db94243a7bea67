#!/usr/bin/env bash
# bench-batching.sh: pgstore.WithBatching against the same binary without it,
# in one loadgen run (BENCHMARKS.md §3 "PostgreSQL, on loopback" and §4 "Near
# and far"). Both servers run examples/payments without the step: loadgen's `idem`
# target gets `-steps=false` (as shipped otherwise), its `idem-nostep` target
# (already `-steps=false`) gets `-batching`. The article's design is the
# control. Rows read:
#   "payments + idem (pgstore tx)"            -> no step, as shipped
#   "payments + idem (pgstore tx), no step"   -> no step, -batching
#
#   scripts/bench-batching.sh [LOADGEN FLAGS...]
#   e.g. scripts/bench-batching.sh -requests 6000 -rounds 4 -warmup 300 -dups 0,30 -pool 16
#        scripts/bench-batching.sh -db-rtt 2ms -requests 3000 -rounds 3 -dups 0,30,90
#
# DSN as loadgen's (-dsn, default $IDEM_TEST_PG_DSN's local test database).
set -euo pipefail

# Called by loadgen as -payments-bin: pick the variant from the arguments.
if [ -n "${BENCH_BATCHING_PAYMENTS:-}" ]; then
  case " $* " in
  *" -steps=false "*) exec "$BENCH_BATCHING_PAYMENTS" "$@" -batching ;;
  *) exec "$BENCH_BATCHING_PAYMENTS" "$@" -steps=false ;;
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
