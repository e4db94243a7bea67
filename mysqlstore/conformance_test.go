package mysqlstore

import (
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storetest"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
)

// TestConformance runs storetest on one database per variant:
//
//   - default: the store as New configures it;
//   - causal: with the Galera causal-read prefix (SET STATEMENT
//     wsrep_sync_wait = 1 FOR ...) forced on, so the prefixed statements
//     are proven on a plain MariaDB too (a Galera node runs them for real);
//   - read_first: WithReadFirst (a plain SELECT before the CALL), with the
//     causal prefix too;
//   - tz+09: a DSN forcing the session time zone to +09:00 and parseTime
//     with a non-UTC loc: the store's instants must not move.
//
// Every variant runs with WithRetentionMargin(0), so that the suite's
// Incarnation/NewAfterSweep case sees Sweep delete its expired record (it
// fails otherwise). The margin is read by Sweep and Maintain only;
// TestSweepMargin checks that a record expired less than the margin ago is
// kept.
func TestConformance(t *testing.T) {
	variants := []struct {
		name   string
		dsn    func(t *testing.T) string
		causal bool
		opts   []Option
	}{
		{"default", func(*testing.T) string { return "" }, false, nil},
		{"causal", func(*testing.T) string { return "" }, true, nil},
		{"read_first", func(*testing.T) string { return "" }, true, []Option{WithReadFirst()}},
		{"tz+09", func(t *testing.T) string {
			cfg := mysqlstoretest.Config(t, "")
			if cfg.Params == nil {
				cfg.Params = map[string]string{}
			}
			cfg.Params["time_zone"] = "'+09:00'"
			cfg.ParseTime = true
			loc, err := time.LoadLocation("Asia/Tokyo")
			if err != nil {
				t.Fatal(err)
			}
			cfg.Loc = loc
			return cfg.FormatDSN()
		}, false, nil},
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			dsn := v.dsn(t)
			opts := append([]Option{WithRetentionMargin(0)}, v.opts...)
			storetest.Run(t, func(tb testing.TB) core.Store {
				s := openStore(tb, mysqlstoretest.NewDB(tb, dsn), opts...)
				s.forceCausal = v.causal
				return s
			})
		})
	}
}
