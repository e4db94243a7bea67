package pgstore_test

import (
	"fmt"
	"log"
	"strings"

	"github.com/idemkit/idem/pgstore"
)

// A team that runs migrations with its own tool writes the store's schema
// into a migration file once (idemctl schema postgres does the same) and
// never calls Migrate; New accepts the result.
func ExampleSchemaSQL() {
	script, err := pgstore.SchemaSQL(pgstore.WithSchema("billing"), pgstore.WithTable("payments_idem"))
	if err != nil {
		log.Fatal(err)
	}
	// os.WriteFile("db/migration/V7__idem.sql", []byte(script), 0o644) for Flyway
	fmt.Println(strings.Contains(script, `CREATE TABLE IF NOT EXISTS "billing"."payments_idem" (`))
	// Output:
	// true
}
