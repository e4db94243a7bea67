#!/usr/bin/env bash
# api-rename.sh rewrites Go code written against idem's pre-issue-20 core
# API to the slimmed one (see API.md / CHANGELOG): store-author names move
# to core/storekit, adapter-kit names to core/adapterkit, test-only lease
# constructors to core/storetest. It edits *.go files under the given
# directories (default: .) in place, fixes imports and runs gofmt.
# Idempotent: running it twice changes nothing more.
set -eu
dirs=("$@"); [ ${#dirs[@]} -gt 0 ] || dirs=(.)
mod=github.com/idemkit/idem

storekit='Status|StatusProcessing|StatusCompleted|StatusFailed|Fence|StoredResponse|Record|ClaimRequest|ClaimResult|Watcher|StepStore|ClaimSyncer|Admin|AdminRecord|Stats|StatusCount|ReleaseRefused|ErrNotFound|ErrNotCommitted|ErrLeaseLive'
adapterkit='Response|HeaderReader|Exchange|PanicReporter|Recorder|NewRecorder|WriteResponse'

mapfile -t files < <(find "${dirs[@]}" -name '*.go' -not -path '*/vendor/*' -print | xargs grep -l 'core\.\|WithOptimisticClaim\|WithTxDB' || true)
for f in "${files[@]}"; do
  sed -i -E \
    -e "s/\bcore\.($storekit)\b/storekit.\1/g" \
    -e "s/\bcore\.($adapterkit)\b/adapterkit.\1/g" \
    -e 's/\bcore\.StoreAs\[/storekit.As[/g' \
    -e 's/\bcore\.(NewLease|ContextWithLease)\b/storetest.\1/g' \
    -e 's/\bcore\.DefaultReplayHeaders\b([^(]|$)/core.DefaultReplayHeaders()\1/g' \
    -e 's/Next\(ctx context\.Context, d \*core\.Decision\)/Next(ctx context.Context, d *adapterkit.Proceed)/g' \
    -e 's/\bd\.MaxResponseBytes\(\)/d.MaxResponseBytes/g' \
    -e 's/\.KeyHeader\(\)/.KeyHeader/g' \
    -e 's/\bpgstore\.WithOptimisticClaim\(/pgstore.WithInsertFirst(/g' \
    -e 's/\bmysqlstore\.WithTxDB\(/mysqlstore.WithTxPool(/g' \
    "$f"
  # storetest's own files call NewLease unqualified.
  if grep -q '^package storetest$' "$f"; then sed -i -E 's/\bstoretest\.(NewLease|ContextWithLease)\b/\1/g' "$f"; fi
  for kit in storekit adapterkit storetest; do
    if grep -v '^\s*//' "$f" | grep -q "\b$kit\." && ! grep -q "\"$mod/core/$kit\"" "$f" && ! grep -q "^package \($kit\|core\)\$" "$f"; then
      if grep -q "^\s*\"$mod/core\"\$" "$f"; then
        sed -i "0,\#^\(\s*\)\"$mod/core\"\$#s##\1\"$mod/core\"\n\1\"$mod/core/$kit\"#" "$f"
      elif grep -q '^import (' "$f"; then
        sed -i "0,/^import (/s##import (\n\t\"$mod/core/$kit\"#" "$f"
      else
        sed -i "0,/^import /s##import \"$mod/core/$kit\"\nimport #" "$f"
      fi
    fi
  done
  if grep -q "\"$mod/core\"" "$f" && ! grep -v '^\s*//' "$f" | grep -q '\bcore\.'; then
    sed -i "\#^\s*\(core \)\?\"$mod/core\"\$#d" "$f"
    sed -i "s#^import \"$mod/core\"\$##" "$f"
  fi
  gofmt -w "$f"
done
