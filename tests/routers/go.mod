module github.com/idemkit/idem/tests/routers

// chi v5.5.0 needs go 1.24; the root module's go line is the floor here.
go 1.26.0

require (
	github.com/go-chi/chi/v5 v5.5.0
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/go-sql-driver/mysql v1.10.2 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.13.0 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace github.com/idemkit/idem => ../../
