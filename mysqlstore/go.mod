module github.com/idemkit/idem/mysqlstore

go 1.25.0

replace github.com/idemkit/idem => ..

require (
	github.com/go-sql-driver/mysql v1.10.2
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
