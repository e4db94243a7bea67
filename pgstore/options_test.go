package pgstore

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgstore/pgstoretest"
)

func TestNewValidation(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	pool := pgstoretest.Pool(t)
	bad := map[string][]Option{
		"empty schema":       {WithSchema("")},
		"quote in schema":    {WithSchema(`a"b`)},
		"space in table":     {WithTable("a b")},
		"leading digit":      {WithTable("1abc")},
		"table too long":     {WithTable(strings.Repeat("t", 41))},
		"schema too long":    {WithSchema(strings.Repeat("s", 64))},
		"zero days ahead":    {WithPartitioning(0)},
		"too many days":      {WithPartitioning(91)},
		"negative margin":    {WithRetentionMargin(-time.Second)},
		"nil tx pool":        {WithTxPool(nil)},
		"negative tx idle":   {WithTxIdleTimeout(-time.Second)},
		"semicolon in table": {WithTable("t; DROP TABLE x")},
	}
	for name, opts := range bad {
		if _, err := New(pool, opts...); err == nil {
			t.Errorf("%s: New succeeded", name)
		} else if !strings.HasPrefix(err.Error(), "pgstore: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
	var nilOpt Option
	s, err := New(pool, nil, nilOpt, WithSchema("Mixed_Case"), WithTable("t1"), WithPartitioning(90),
		WithRetentionMargin(0), WithTxPool(pool), WithTxIdleTimeout(time.Minute))
	if err != nil {
		t.Fatalf("valid options: %v", err)
	}
	if s.names.table != `"Mixed_Case"."t1"` {
		t.Errorf("quoted table = %s", s.names.table)
	}
	if !s.Partitioned() || s.Pool() != pool {
		t.Error("accessors")
	}
	var _ *pgxpool.Pool = s.Pool()
}
