package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/pgstore"
)

// schemaFlags are what a store's schema depends on.
type schemaFlags struct {
	schema, table string
	partitioned   bool
}

// schemaPrinters render each store's migrations as plain SQL, by the name
// `idemctl schema STORE` takes. A store is one line here.
var schemaPrinters = map[string]func(f schemaFlags) (string, error){
	"postgres": func(f schemaFlags) (string, error) {
		opts := []pgstore.Option{pgstore.WithSchema(f.schema), pgstore.WithTable(f.table)}
		if f.partitioned {
			opts = append(opts, pgstore.WithPartitioning(2))
		}
		return pgstore.SchemaSQL(opts...)
	},
	"mysql": func(f schemaFlags) (string, error) { return mysqlstore.SchemaSQL(mysqlstore.WithTable(f.table)) },
}

// schemaAliases are other names people type for a store.
var schemaAliases = map[string]string{"postgresql": "postgres", "pg": "postgres", "pgstore": "postgres",
	"mariadb": "mysql", "mysqlstore": "mysql"}

// schemaStores lists the stores for the usage text.
var schemaStores = func() string {
	names := make([]string, 0, len(schemaPrinters))
	for n := range schemaPrinters {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}()

// printSchema runs `idemctl schema STORE [flags]`. It needs no database:
// the SQL comes from the store's embedded migrations, rendered for the
// flags as the store's Migrate would.
func printSchema(stdout io.Writer, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemctl schema", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: idemctl schema STORE [flags] > migration.sql   (STORE: %s)\n\n"+
			"Prints what the store's Migrate would create on an empty database, and the rows recording it\n"+
			"as applied (so Migrate and New accept the result). Apply it with your migration tool.\n\n", schemaStores)
		fs.PrintDefaults()
	}
	var f schemaFlags
	fs.StringVar(&f.schema, "schema", "public", "PostgreSQL schema of the store's tables (pgstore.WithSchema)")
	fs.StringVar(&f.table, "table", "idem_records", "records table (WithTable)")
	fs.BoolVar(&f.partitioned, "partitioned", false, "PostgreSQL: daily partitioned retention (pgstore.WithPartitioning)")
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(positional) != 1 {
		fmt.Fprintf(stderr, "idemctl schema: want one STORE (%s)\n", schemaStores)
		return exitUsage
	}
	name := strings.ToLower(positional[0])
	if alias, ok := schemaAliases[name]; ok {
		name = alias
	}
	render, ok := schemaPrinters[name]
	if !ok {
		fmt.Fprintf(stderr, "idemctl schema: unknown store %q (want %s)\n", positional[0], schemaStores)
		return exitUsage
	}
	if f.partitioned && name != "postgres" {
		fmt.Fprintf(stderr, "idemctl schema: -partitioned is for postgres only\n")
		return exitUsage
	}
	sql, err := render(f)
	if err != nil {
		// Invalid options (a table name the store refuses): the user's.
		fmt.Fprintf(stderr, "idemctl schema: %v\n", err)
		return exitUsage
	}
	if _, err := io.WriteString(stdout, sql); err != nil {
		fmt.Fprintf(stderr, "idemctl schema: %v\n", err)
		return exitFailure
	}
	return exitOK
}
