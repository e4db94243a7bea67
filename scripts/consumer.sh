#!/usr/bin/env bash
# The scratch-consumer check (issue 20): a service that imports only ginidem and core must not
# get fiber, echo, pgx, the MySQL driver, the OpenTelemetry SDK or libopenapi in its module
# graph. It builds a throwaway module outside the workspace that requires idem and ginidem
# through local replaces (as a released version would be required), and reads `go list -m all`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cat >"$dir/go.mod" <<MOD
module example.com/consumer

go 1.25.0

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/idemkit/idem/ginidem v0.0.0-00010101000000-000000000000
)

replace (
	github.com/idemkit/idem => $root
	github.com/idemkit/idem/ginidem => $root/ginidem
)
MOD
cat >"$dir/main.go" <<'SRC'
package main

import (
	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/ginidem"
)

func main() {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace())
	if err != nil {
		panic(err)
	}
	mw, err := ginidem.New(eng)
	if err != nil {
		panic(err)
	}
	r := gin.New()
	r.POST("/payments", mw, func(c *gin.Context) { c.JSON(201, gin.H{"ok": true}) })
	_ = r
}
SRC

cd "$dir"
export GOWORK=off GOFLAGS=-mod=mod
go mod tidy
go build ./...
mods=$(go list -m all)
bad=$(grep -E '^(github\.com/gofiber/|github\.com/valyala/fasthttp|github\.com/labstack/echo|github\.com/jackc/pgx|github\.com/go-sql-driver/mysql|go\.opentelemetry\.io/otel/sdk|github\.com/pb33f/libopenapi|github\.com/idemkit/idem/(pgstore|mysqlstore|fiberidem|fiberv3idem|echoidem|echov5idem|otelidem|sqlitestore|grpcidem|tests|examples))' <<<"$mods" || true)
if [ -n "$bad" ]; then
	echo "consumer: a module importing only ginidem and core has in its graph:" >&2
	echo "$bad" >&2
	exit 1
fi
echo "consumer: ginidem + core: $(wc -l <<<"$mods") modules in the graph, none of fiber, echo, pgx, mysql, otel SDK, libopenapi"
