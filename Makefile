# idem — common tasks. `make test` is what CI runs (.ci/run).
GO          ?= go
# Every module of the workspace (go.work): `./...` alone covers the root module only.
MODULES     := $(shell $(GO) list -m -f '{{.Dir}}' | sed 's|^$(CURDIR)|.|')
PKGS        ?= $(addsuffix /...,$(MODULES))
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 60s

.PHONY: test release-check tidy model services pgbouncer test-galera test-pgbouncer test-failover lint fmt bench bench-inproc bench-pg bench-mysql bench-sqlite bench-e2e bench-far fuzz chaos crash demo race-demo soak

## test: go vet + the whole suite with the race detector, every module, then release-check -quick
## (each published module, at a release version, type-checks for a consumer outside the workspace
## and pulls in no other integration's dependencies). Starts PostgreSQL and MariaDB first
## when they are installed but not answering (scripts/services.sh; see README), installs
## pgbouncer if absent, and runs the topology tests too (PgBouncer, primary failover: ~30 s)
test: services pgbouncer
	$(GO) vet -race $(PKGS) # -race: the vet build shares the race-built packages the tests need (a cold make test compiles them once, not twice)
	IDEM_TEST_TOPOLOGY=1 $(GO) test -race -count=1 -timeout 12m $(PKGS)
	./scripts/release-check.sh -quick # after the tests: their downloads fill the module cache it reads from

## model: tests/model at length: many more randomized concurrent histories per store (memstore,
## pgstore, mysqlstore and sqlitestore, plain and transactional; pgstore also driven across its
## claims' switch, WithPartitioning and examples/payments' configuration; with connection kills or, for
## sqlitestore, cancelled calls and two processes on one file) checked for linearizability
## against the protocol's reference model. `make test` runs a bounded number (IDEM_MODEL_ITER
## sets it; IDEM_MODEL_SEED replays a seed's choices).
MODEL_ITER ?= 400
model: services
	IDEM_MODEL_ITER=$(MODEL_ITER) $(GO) test -race -count=1 -timeout 60m -v -run . ./tests/model

## release-check: would release VERSION (default: the minor after the last vX.Y.Z tag, or v0.1.0)
## build for its users? Every module with its idem requirements at VERSION and no replace,
## served from a file-system GOPROXY as the tags would publish it; a scratch module per published
## module `go get`s it and compiles all its packages (idemctl: `go install ...@VERSION`), alone,
## with no other integration's dependencies in its graph; then gorelease's API report against the
## previous tag (scripts/release-check.sh)
release-check:
	./scripts/release-check.sh $(VERSION)

## tidy: go mod tidy in every module
tidy:
	@for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod tidy) || exit 1; done

## pgbouncer: Debian's pgbouncer, for tests/topology (installed if absent)
pgbouncer:
	@command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || (apt-get update && apt-get install -y pgbouncer)

## services: make sure PostgreSQL and MariaDB answer (start them if installed, else say how to install)
services:
	@./scripts/services.sh

## test-galera: the Galera tests (tests/galera) on a throw-away three-node MariaDB Galera cluster
## on loopback (scripts/galera.sh starts it, runs them, removes it). `make test` runs them too:
## there TestMain starts the same cluster itself.
test-galera:
	./scripts/galera.sh run $(GO) test -race -count=1 -timeout 10m -v ./tests/galera

## lint: gofmt, go vet and staticcheck
lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)
	cd internal/tools && GOWORK=off $(GO) vet ./... && GOWORK=off $(GO) run $(STATICCHECK) ./... # outside go.work

fmt:
	gofmt -w .

## bench: the benchmark suite recorded in BENCHMARKS.md (each target below names its sections there)
bench: bench-inproc bench-pg bench-mysql bench-sqlite bench-e2e bench-far

## bench-inproc: §1 and §7: per-adapter and engine overhead on memstore, fiberidem vs Fiber's idempotency middleware
bench-inproc:
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./core/... ./nethttpidem ./ginidem ./echoidem ./echov5idem ./fiberidem

## bench-pg: §2 pgstore claim+complete vs the raw-statement floors (throughput and CPU), a replay
## inserting first and calling the function first, NOTIFY cost, Tx's txid at BEGIN; §5 wait-mode wake-up; §6 the cost of a step
bench-pg:
	$(GO) test -run '^$$' -bench 'BenchmarkFloor/(plain|partitioned)/keys=random/workers=16$$' -benchtime 2000x -count 8 -timeout 30m ./pgstore
	$(GO) test -run '^$$' -bench 'BenchmarkFloor/(plain|partitioned)/keys=random/workers=(1|64)$$' -benchtime 600x -count 3 -timeout 30m ./pgstore
	IDEM_FLOOR_DIAG=1 $(GO) test -run '^$$' -bench 'BenchmarkFloorCPU' -benchtime 4000x -count 3 ./pgstore
	$(GO) test -run '^$$' -bench 'BenchmarkConformance/(plain|plain-function-first)/ClaimReplay/Serial' -benchmem -count 4 ./pgstore
	$(GO) test -run '^$$' -bench 'BenchmarkNotifyCost' -benchtime 1500x -count 3 ./pgstore
	$(GO) test -run '^$$' -bench 'BenchmarkTxFirstExecution' -benchtime 4000x ./pgstore
	$(GO) test -run '^$$' -bench 'WaitWake' -benchtime 50x -count 2 ./core ./pgstore
	$(GO) test -run '^$$' -bench 'BenchmarkStep' -benchtime 1500x -count 3 -timeout 20m ./pgstore

## bench-mysql: §2 mysqlstore claim+complete vs its own raw statements (alternating, same run), replays
## (CALL vs WithReadFirst); §5 wait-mode wake-up by polling; §3 e2e on MariaDB vs the article's design
## and the bare endpoint
bench-mysql:
	$(GO) test -run '^$$' -bench 'BenchmarkClaimComplete' -benchtime 1500x -count 3 -timeout 20m ./mysqlstore
	$(GO) test -run '^$$' -bench 'BenchmarkConformance/ClaimReplay' -benchtime 2000x -count 3 ./mysqlstore
	$(GO) test -run '^$$' -bench 'WaitWake' -benchtime 50x ./mysqlstore
	$(GO) test -run '^$$' -bench 'BenchmarkReplay$$' -benchtime 4000x -count 2 ./mysqlstore
	$(GO) run ./examples/loadgen -dsn 'mysql://root@127.0.0.1:3306/test' -provider-http -targets idem,article,baseline -logs off -requests 3000 -rounds 3 -warmup 200 -dups 0,30,90

## bench-sqlite: §2 sqlitestore claim+complete vs its own statements and a naive floor; replay cost;
## a first execution with and without group commit; §3 examples/payments on SQLite under loadgen
bench-sqlite:
	$(GO) test -run '^$$' -bench 'BenchmarkClaimComplete' -benchtime 1500x -count 3 ./sqlitestore
	$(GO) test -run '^$$' -bench 'BenchmarkConformance' -benchtime 2000x -count 1 ./sqlitestore
	$(GO) test -run '^$$' -bench 'BenchmarkFirstExecution' -benchtime 4000x -count 3 ./sqlitestore
	$(GO) run ./examples/loadgen -dsn sqlite:// -provider-http -targets idem,idem-nostep,article,baseline -logs off -requests 3000 -rounds 3 -warmup 200 -dups 0,30,90

## bench-e2e: §3 examples/payments on pgstore under the loopback load driver vs the article's design and
## the bare endpoint: as shipped, batching on and off in one run (scripts/bench-batching.sh),
## PostgreSQL alone per design (scripts/pgfloor.sh), logging on and off, pool sizing
bench-e2e:
	$(GO) run ./examples/loadgen -provider-http -targets idem,idem-nostep,article,baseline -logs off -requests 1500 -rounds 3 -warmup 200 -dups 0,30,90 -pool 16
	scripts/bench-batching.sh -requests 6000 -rounds 4 -warmup 300 -dups 0,30 -pool 16
	scripts/pgfloor.sh 8
	$(GO) run ./examples/loadgen -requests 3000 -rounds 3 -concurrency 16 -dups 0,30,90 -logs default,off
	$(GO) run ./examples/loadgen -requests 1500 -concurrency 32 -dups 0 -pool 32 -pools 4,8 -provider-latency 50ms

## bench-far: §4 the same servers with the database a round trip away (loadgen -db-rtt: a relay on
## 127.0.0.1), as shipped at 0, 0.5, 1, 2, 5 and 20 ms; batching on against off at 2 ms, then A/A
bench-far:
	@for rtt in 0 0.5ms 1ms 2ms 5ms 20ms; do \
		echo "loadgen -db-rtt $$rtt"; \
		$(GO) run ./examples/loadgen -provider-http -db-rtt $$rtt -targets idem,idem-nostep,article,baseline -logs off -requests 3000 -rounds 3 -warmup 200 -dups 0,30,90 -pool 16 || exit 1; \
	done
	scripts/bench-batching.sh -db-rtt 2ms -requests 8000 -rounds 4 -warmup 1000 -dups 0,90 -pool 16
	BENCH_BATCHING_AA=1 scripts/bench-batching.sh -db-rtt 2ms -requests 8000 -rounds 4 -warmup 1000 -dups 0,90 -pool 16

## soak: §9 examples/payments for SOAK_DURATION (default 10m) on each store (SQLite, PostgreSQL, MariaDB)
## under steady load with duplicates, SIGKILLing one of its two instances every minute; samples every
## 30s; checks that no payment was lost or doubled. Not part of make test.
SOAK_DURATION ?= 10m
soak: services
	$(GO) run ./examples/soak -duration $(SOAK_DURATION)

## fuzz: each fuzz target for FUZZTIME
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime $(FUZZTIME) ./core
	$(GO) test -run '^$$' -fuzz '^FuzzFingerprint$$' -fuzztime $(FUZZTIME) ./core
	$(GO) test -run '^$$' -fuzz '^FuzzBadInputKeyHeader$$' -fuzztime $(FUZZTIME) ./core
	$(GO) test -run '^$$' -fuzz '^FuzzBadInputCanonicalJSON$$' -fuzztime $(FUZZTIME) ./core
	$(GO) test -run '^$$' -fuzz '^FuzzHeaderJSON$$' -fuzztime $(FUZZTIME) ./pgstore
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeClaimRow$$' -fuzztime $(FUZZTIME) ./pgstore
	$(GO) test -run '^$$' -fuzz '^FuzzParseHeader$$' -fuzztime $(FUZZTIME) ./core/storekit/sqlkit

## chaos: full-size chaos tests (10k requests; two payments instances on one PostgreSQL schema,
## then on one MariaDB database, one waiting for in-flight duplicates (-wait 1s), SIGKILLs,
## pg_terminate_backend / KILL CONNECTION, 30% duplicates). `make test` runs 3000-request versions
## (and the Galera one, tests/galera).
chaos:
	IDEM_CHAOS_REQUESTS=10000 $(GO) test -count=1 -timeout 30m -run '^TestChaos(MySQL)?$$' -v ./tests/chaos

## crash: TestCrashPostgres with 15 rounds (PostgreSQL crashed with pg_ctl -m immediate under the
## payments flow, on a throwaway cluster on port 15702). `make test` runs 3 rounds.
crash:
	IDEM_CRASH_ROUNDS=15 $(GO) test -count=1 -timeout 20m -run '^TestCrashPostgres$$' -v ./examples/payments

## demo: the payments example on 127.0.0.1:8080 (keys and ledger in a SQLite file, no setup)
demo:
	$(GO) run ./examples/payments

## race-demo: naive cache middleware vs idem under a burst of duplicates
race-demo:
	$(GO) run ./examples/racedemo

## test-pgbouncer: examples/payments through PgBouncer in transaction pooling (installs
## Debian's pgbouncer if absent; runs it as the postgres user on 127.0.0.1:15901)
test-pgbouncer: pgbouncer
	IDEM_TEST_TOPOLOGY=1 $(GO) test -race -count=1 -timeout 5m -run '^TestPgBouncer$$' -v ./tests/topology

## test-failover: a private primary + streaming standby (ports 15910-15913, as the postgres
## user, temp dirs), two payments instances on a multi-host DSN, the primary crashed and the
## standby promoted mid-run; synchronous then asynchronous replication
test-failover:
	IDEM_TEST_TOPOLOGY=1 $(GO) test -race -count=1 -timeout 10m -run '^TestFailover$$' -v ./tests/topology
