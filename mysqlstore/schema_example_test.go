package mysqlstore_test

import (
	"fmt"
	"log"
	"strings"

	"github.com/idemkit/idem/mysqlstore"
)

// The store's schema as one script for the mysql client or Flyway
// (idemctl schema mysql prints the same).
func ExampleSchemaSQL() {
	script, err := mysqlstore.SchemaSQL(mysqlstore.WithTable("payments_idem"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(strings.Contains(script, "CREATE TABLE IF NOT EXISTS `payments_idem` ("), strings.Contains(script, "DELIMITER ;;"))
	// Output:
	// true true
}
