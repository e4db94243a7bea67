#!/usr/bin/env bash
# make release-check (issue 34): would release VERSION build for someone who `go get`s it?
#
# The modules of go.work are copied to a temp dir and edited as the release commit edits them
# (every requirement on another idem module set to VERSION, the local replaces dropped: a
# replace in a dependency's go.mod is ignored by its consumers), then laid out as a module proxy
# in the form the tags would publish (internal/tools/modproxy). Outside the workspace, with no
# replace, one scratch module per published module `go get`s it at VERSION and builds every
# package it has: each module is shown to build on its own, with the dependency versions it
# alone selects, and its module graph must hold no other idem module, framework, driver or SDK
# than its own. cmd/idemctl is built as the README installs it, `go install ...@VERSION`. Last,
# gorelease reports the API changes since the previous release tag.
#
# -quick (make test): the consumers are type-checked (internal/tools/typecheck) instead of
# compiled, idemctl's too, and there is no API report. Compiling every integration's
# dependencies without the race detector costs minutes on a cold build cache; type-checking
# finds the same errors in idem's code and its use of each dependency.
#
#   scripts/release-check.sh [-quick] [VERSION]   (default: the minor after the last tag, or v0.1.0)
set -euo pipefail
quick=0
if [ "${1:-}" = -quick ]; then quick=1; shift; fi
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

tags=$(git tag -l 'v*' | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sort -V || true)
version=${1:-}
if [ -z "$version" ]; then
	version=$(tail -1 <<<"$tags" | awk -F. 'NF { print $1 "." $2+1 ".0"; next } { print "v0.1.0" }')
fi
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || { echo "release-check: VERSION $version is not vX.Y.Z" >&2; exit 2; }
# The previous release: the highest vX.Y.Z tag of the root module below VERSION.
base=$(printf '%s\n%s\n' "$tags" "$version" | sed '/^$/d' | sort -V | awk -v v="$version" '$0 == v { print prev; exit } { prev = $0 }')

tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
mkdir -p "$tmp/src" "$tmp/proxy" "$tmp/bin" "$tmp/consumers"

# The tree a commit would hold: tracked and untracked-but-not-ignored files.
git ls-files -z -c -o --exclude-standard |
	while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
	tar --null -T - -cf - | tar -C "$tmp/src" -xf -

dirs=$(go work edit -json | jq -r '.Use[].DiskPath')
# examples and tests are tagged with the rest but not imported by users (as in internal/doccheck).
published=$(grep -vxE '\./(examples|tests)' <<<"$dirs")
modpath() { go mod edit -json "$1/go.mod" | jq -r .Module.Path; }

GOWORK=off go build -C internal/tools -o "$tmp/bin/" ./modproxy ./typecheck
(cd "$tmp/src" && "$tmp/bin/modproxy" -proxy "$tmp/proxy" -version "$version" -release $dirs)

# The consumers' environment: no workspace, no replace; idem from the local proxy, the rest from
# the module cache or the usual proxy. A module cache of its own (a fake release must never
# enter the real one), and -trimpath so that builds from it are found in GOCACHE next time.
realproxy=$(go env GOPROXY)
realcache=$(go env GOMODCACHE)
cenv() {
	env GOWORK=off GOFLAGS='-mod=mod -modcacherw -trimpath' GOMODCACHE="$tmp/modcache" \
		GOPROXY="file://$tmp/proxy,file://$realcache/cache/download,$realproxy" \
		GONOSUMDB=github.com/idemkit/idem GOPRIVATE= GONOPROXY= TMPDIR="$tmp" "$@"
}
# check MODULE PACKAGES: go get MODULE@VERSION, then compile (or type-check) PACKAGES.
if [ $quick = 1 ]; then
	check() { cenv go get "$1@$version" && cenv "$tmp/bin/typecheck" -full github.com/idemkit/idem "$2"; }
else
	check() { cenv go get "$1@$version" && cenv go build "$2"; }
fi

# What a consumer of one module must not have in its module graph: another idem module, or a
# framework, driver or SDK other than the one that module is for.
heavy='^(github\.com/idemkit/idem/|github\.com/gin-gonic/gin|github\.com/gofiber/|github\.com/valyala/fasthttp|github\.com/labstack/echo|github\.com/jackc/pgx|github\.com/go-sql-driver/mysql|modernc\.org/sqlite|go\.opentelemetry\.io/otel/sdk|google\.golang\.org/grpc|github\.com/pb33f/libopenapi)'
own() {
	case $1 in
	ginidem) echo 'github\.com/gin-gonic/gin' ;;
	echoidem | echov5idem) echo 'github\.com/labstack/echo' ;;
	fiberidem | fiberv3idem) echo 'github\.com/gofiber/|github\.com/valyala/fasthttp' ;;
	pgstore) echo 'github\.com/jackc/pgx' ;;
	mysqlstore) echo 'github\.com/go-sql-driver/mysql' ;;
	sqlitestore) echo 'modernc\.org/sqlite' ;;
	otelidem) echo 'go\.opentelemetry\.io/otel/sdk' ;;
	grpcidem) echo 'google\.golang\.org/grpc|go\.opentelemetry\.io/otel/sdk' ;; # grpc's go.mod names the SDK
	*) echo '$^' ;;
	esac
}

for d in $published; do
	path=$(modpath "$d")
	name=$(basename "$path")
	c="$tmp/consumers/$name"
	mkdir -p "$c"
	start=$SECONDS
	if [[ $d == ./cmd/* ]]; then
		if [ $quick = 0 ]; then
			if ! (cd "$c" && GOBIN="$tmp/bin" cenv go install "$path@$version") >"$c/log" 2>&1; then
				grep -vE '^go: (downloading|added|upgraded) ' "$c/log" >&2
				echo "release-check: go install $path@$version fails" >&2
				exit 1
			fi
			echo "release-check: go install $path@$version: $("$tmp/bin/$name" version | head -1) ($((SECONDS - start))s)"
			continue
		fi
		# go install refuses a module whose go.mod has replace or exclude directives.
		if grep -qE '^\s*(replace|exclude)\b' "$tmp/src/$d/go.mod"; then
			echo "release-check: $path@$version has replace or exclude directives: go install would refuse it" >&2
			exit 1
		fi
		pkgs=$path target=$path
	else
		pkgs=$(cd "$d" && go list -f '{{if and .GoFiles (ne .Name "main")}}{{.ImportPath}}{{end}}' ./... | grep -v '/internal\b' || true)
		target=./...
		{
			echo '// Package consumer imports every package of one idem module, as a service would.'
			echo 'package consumer'
			echo
			for p in $pkgs; do echo "import _ \"$p\""; done
		} >"$c/consumer.go"
	fi
	printf 'module example.com/consumer\n' >"$c/go.mod"
	# Hashes of the third-party modules from the repository (no checksum-database look-ups).
	cat "$d/go.sum" go.sum 2>/dev/null | sort -u >"$c/go.sum"
	if ! (cd "$c" && check "$path" "$target") >"$c/log" 2>&1; then
		grep -vE '^go: (downloading|added|upgraded) ' "$c/log" >&2
		echo "release-check: $path@$version does not build for a consumer" >&2
		exit 1
	fi
	graph=$(cd "$c" && cenv go list -m all | awk '{print $1}')
	bad=$(grep -E "$heavy" <<<"$graph" | grep -vxF "$path" | grep -vE "^($(own "$name"))" || true)
	if [[ $d != ./cmd/* ]] && [ -n "$bad" ]; then
		echo "release-check: a consumer of $path alone has in its module graph:" >&2
		echo "$bad" >&2
		exit 1
	fi
	echo "release-check: $path@$version: $(wc -w <<<"$pkgs") packages $([ $quick = 1 ] && echo type-check || echo build), $(wc -l <<<"$graph") modules in the graph ($((SECONDS - start))s)"
done

if [ $quick = 1 ]; then
	echo "release-check: $version builds for consumers (API report: make release-check)"
	exit 0
fi

# The API report: gorelease, against the previous release's tags served from the same proxy.
# It informs: in v0 a minor release may change the API (gorelease lists how). It fails the check
# where gorelease finds VERSION not valid (errors in packages; from v1, incompatible changes in a
# minor release), and for incompatible changes in a patch release, which gorelease allows in v0.
if [ -z "$base" ]; then
	echo "release-check: API: no release tag (vX.Y.Z) before $version, nothing to compare with"
	exit 0
fi
mkdir -p "$tmp/base"
based=()
for d in $published; do
	tag=${d#./}/$base
	[ "$d" = . ] && tag=$base
	if git rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
		git archive "$tag" -- "${d#./}" | tar -C "$tmp/base" -xf -
		based+=("$d")
	fi
done
(cd "$tmp/base" && "$tmp/bin/modproxy" -proxy "$tmp/proxy" -version "$base" "${based[@]}")
# Unlisted, so that gorelease does not take VERSION as published already.
find "$tmp/proxy" -name list -exec sed -i "/^$version\$/d" {} +
GOWORK=off go build -C internal/tools -o "$tmp/bin/" golang.org/x/exp/cmd/gorelease
invalid=0
for d in $published; do
	path=$(modpath "$d")
	if [[ " ${based[*]} " != *" $d "* ]]; then
		echo "== $path: new in $version (no tag for $base)"
		continue
	fi
	echo "== $path: $base -> $version"
	out=$(cd "$tmp/src/$d" && cenv "$tmp/bin/gorelease" -base="$base" -version="$version" 2>&1) || true
	echo "$out"
	if grep -q "^$version is not a valid semantic version for this release" <<<"$out"; then invalid=1; fi
	if [ "$(cut -d. -f1,2 <<<"$base")" = "$(cut -d. -f1,2 <<<"$version")" ] && grep -q '^## incompatible changes' <<<"$out"; then
		echo "release-check: $path: incompatible changes in a patch release" >&2
		invalid=1
	fi
done
[ $invalid = 0 ] || { echo "release-check: $version is not a valid version for these changes" >&2; exit 1; }
