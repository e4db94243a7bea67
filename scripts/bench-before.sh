#!/usr/bin/env bash
# bench-before.sh: examples/payments as shipped at REV (an earlier commit)
# against the working tree's, in one loadgen run (BENCHMARKS.md §3): the
# same flags, the same database, the variants alternating in rounds. Rows
# read:
#   "payments + idem (…), before" -> REV
#   "payments + idem (…)"         -> the working tree
#
#   scripts/bench-before.sh REV [LOADGEN FLAGS...]
#   e.g. scripts/bench-before.sh HEAD~1 -dsn sqlite:// -provider-http -targets idem,idem-before,article,baseline -logs off
set -euo pipefail
rev=${1:?usage: scripts/bench-before.sh REV [LOADGEN FLAGS...]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
cleanup() {
  git -C "$root" worktree remove --force "$dir/src" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
cd "$root"
git worktree add --detach -q "$dir/src" "$rev"
(cd "$dir/src" && go build -o "$dir/payments-before" ./examples/payments)
go run ./examples/loadgen -payments-before "$dir/payments-before" "$@"
