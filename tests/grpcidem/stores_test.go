package grpcidem_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/grpcidem"
	"github.com/idemkit/idem/grpcidem/grpcidemtest"
	"github.com/idemkit/idem/mysqlstore"
	"github.com/idemkit/idem/mysqlstore/mysqlstoretest"
	"github.com/idemkit/idem/pgstore"
	"github.com/idemkit/idem/pgstore/pgstoretest"
	"github.com/idemkit/idem/sqlitestore/sqlitestoretest"
	"github.com/idemkit/idem/tests/internal/mystores"
	"github.com/idemkit/idem/tests/internal/pgstores"
)

func TestConformancePostgres(t *testing.T) {
	grpcidemtest.Run(t, func(tb testing.TB) core.Store {
		s, _ := pgstores.Store(tb)
		return s
	})
}

func TestConformanceMariaDB(t *testing.T) {
	grpcidemtest.Run(t, func(tb testing.TB) core.Store { return mystores.Store(tb) })
}

func TestConformanceSQLite(t *testing.T) {
	grpcidemtest.Run(t, func(tb testing.TB) core.Store { return sqlitestoretest.Store(tb) })
}

// Environment of a server child of the crash tests.
const (
	envServer = "GRPCIDEM_CRASH_SERVER" // "hang" (blocks mid-call after the charge) or "serve"
	envDB     = "GRPCIDEM_CRASH_DB"     // the schema (PostgreSQL) or database (MariaDB)
)

// crashDB is what the crash test needs of a database: in the parent, a
// fresh schema or database with the ledger and provider tables, and the
// final counts; in a server child, the store and the handler's writes.
type crashDB struct {
	setup func(t *testing.T) (db string, counts func() (booked, distinct, charged, recharged int))
	open  func(t *testing.T, db string) (s core.Store, book func(ctx context.Context, p string) error, charge func(ctx context.Context, relay, p string) error)
}

// TestCrashTwoServers: a client with a retry policy sends payments to two
// server processes on one database; one server is SIGKILLed mid-call,
// after the provider charged and before its transaction committed. Its
// calls fail over (UNAVAILABLE, retried by policy with the same key) to
// the other server, which takes them over once the lease lapses: each
// payment is booked once, and the provider (deduplicating by relay key)
// charges each once.
func TestCrashTwoServers(t *testing.T) { crashTwoServers(t, "TestCrashTwoServers", pgCrash) }

// TestCrashTwoServersMariaDB is TestCrashTwoServers on MariaDB.
func TestCrashTwoServersMariaDB(t *testing.T) {
	crashTwoServers(t, "TestCrashTwoServersMariaDB", myCrash)
}

var pgCrash = crashDB{
	setup: func(t *testing.T) (string, func() (int, int, int, int)) {
		pool := pgstoretest.Pool(t)
		schema := pgstoretest.Schema(t, pool)
		require.NoError(t, pgstore.Migrate(t.Context(), pool, pgstore.WithSchema(schema)))
		ledger, provider := pgx.Identifier{schema, "ledger"}.Sanitize(), pgx.Identifier{schema, "provider"}.Sanitize()
		for _, q := range []string{
			"CREATE TABLE " + ledger + " (payment text NOT NULL)", // no unique constraint: a double booking shows
			"CREATE TABLE " + provider + " (relay_key text PRIMARY KEY, payment text NOT NULL, attempts int NOT NULL)",
		} {
			_, err := pool.Exec(t.Context(), q)
			require.NoError(t, err)
		}
		return schema, func() (booked, distinct, charged, recharged int) {
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*), count(DISTINCT payment) FROM "+ledger).Scan(&booked, &distinct))
			require.NoError(t, pool.QueryRow(t.Context(), "SELECT count(*), count(*) FILTER (WHERE attempts > 1) FROM "+provider).Scan(&charged, &recharged))
			return
		}
	},
	open: func(t *testing.T, schema string) (core.Store, func(context.Context, string) error, func(context.Context, string, string) error) {
		pool := pgstoretest.Pool(t)
		store, err := pgstore.New(pool, pgstore.WithSchema(schema), pgstore.WithTransactional())
		require.NoError(t, err)
		t.Cleanup(store.Close)
		ledger, provider := pgx.Identifier{schema, "ledger"}.Sanitize(), pgx.Identifier{schema, "provider"}.Sanitize()
		return store, func(ctx context.Context, p string) error {
				tx, err := pgstore.Tx(ctx)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, "INSERT INTO "+ledger+" (payment) VALUES ($1)", p)
				return err
			}, func(ctx context.Context, relay, p string) error {
				_, err := pool.Exec(ctx, "INSERT INTO "+provider+" VALUES ($1, $2, 1) ON CONFLICT (relay_key) DO UPDATE SET attempts = "+provider+".attempts + 1", relay, p)
				return err
			}
	},
}

var myCrash = crashDB{
	setup: func(t *testing.T) (string, func() (int, int, int, int)) {
		cfg := mysqlstoretest.Database(t, "")
		db := mysqlstoretest.Open(t, cfg)
		require.NoError(t, mysqlstore.Migrate(t.Context(), db))
		for _, q := range []string{
			"CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, payment VARCHAR(64) NOT NULL)",
			"CREATE TABLE provider (relay_key VARCHAR(64) PRIMARY KEY, payment VARCHAR(64) NOT NULL, attempts INT NOT NULL)",
		} {
			_, err := db.ExecContext(t.Context(), q)
			require.NoError(t, err)
		}
		return cfg.DBName, func() (booked, distinct, charged, recharged int) {
			require.NoError(t, db.QueryRowContext(t.Context(), "SELECT count(*), count(DISTINCT payment) FROM ledger").Scan(&booked, &distinct))
			require.NoError(t, db.QueryRowContext(t.Context(), "SELECT count(*), coalesce(sum(attempts > 1), 0) FROM provider").Scan(&charged, &recharged))
			return
		}
	},
	open: func(t *testing.T, name string) (core.Store, func(context.Context, string) error, func(context.Context, string, string) error) {
		cfg := mysqlstoretest.Config(t, "")
		cfg.DBName = name
		db := mysqlstoretest.Open(t, cfg)
		store, err := mysqlstore.New(db)
		require.NoError(t, err)
		t.Cleanup(store.Close)
		return store, func(ctx context.Context, p string) error {
				tx, err := mysqlstore.Tx(ctx)
				if err != nil {
					return err
				}
				_, err = tx.ExecContext(ctx, "INSERT INTO ledger (payment) VALUES (?)", p)
				return err
			}, func(ctx context.Context, relay, p string) error {
				_, err := db.ExecContext(ctx, "INSERT INTO provider VALUES (?, ?, 1) ON DUPLICATE KEY UPDATE attempts = attempts + 1", relay, p)
				return err
			}
	},
}

func crashTwoServers(t *testing.T, top string, cdb crashDB) {
	if mode := os.Getenv(envServer); mode != "" {
		crashServer(t, mode, cdb, os.Getenv(envDB))
		return
	}
	const payments = 6
	dbName, counts := cdb.setup(t)
	hang, hangAddr, midcall := spawnServer(t, top, "hang", dbName)
	_, serveAddr, _ := spawnServer(t, top, "serve", dbName)

	r := manual.NewBuilderWithScheme("crash")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: hangAddr}, {Addr: serveAddr}}})
	cc := grpcidemtest.Dial(t, "crash:///payments", grpc.WithResolvers(r),
		grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}], `+
			strings.TrimPrefix(grpcidemtest.RetryServiceConfig, "{")))
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	// Until both servers answer: round robin then alternates between them.
	seen := map[string]bool{}
	for i := 0; len(seen) < 2 && i < 50; i++ {
		var out wrapperspb.StringValue
		require.NoError(t, cc.Invoke(ctx, grpcidemtest.Lookup, wrapperspb.String("x"), &out))
		seen[out.GetValue()] = true
	}
	require.Len(t, seen, 2, "servers that answered")

	var wg sync.WaitGroup
	for i := range payments {
		wg.Go(func() {
			var out wrapperspb.StringValue
			p := fmt.Sprintf("pay-%d", i)
			if assert.NoError(t, cc.Invoke(ctx, grpcidemtest.Charge, wrapperspb.String(p), &out), p) { // not require: in a goroutine
				assert.Equal(t, "booked "+p, out.GetValue(), p)
			}
		})
	}
	// Kill the hanging server once a call is mid-way in it.
	select {
	case <-midcall:
	case <-ctx.Done():
		require.Fail(t, "no call reached the hanging server")
	}
	require.NoError(t, hang.Process.Kill())
	wg.Wait()

	booked, distinct, charged, recharged := counts()
	assert.Equal(t, payments, booked, "ledger rows")
	assert.Equal(t, payments, distinct, "payments in the ledger")
	assert.Equal(t, payments, charged, "provider charges")
	require.NotZero(t, recharged, "charges retried: the killed server's calls were not taken over mid-call")
	t.Logf("%d payments, %d taken over after the SIGKILL", payments, recharged)
}

// spawnServer starts a server child; the channel gets its "midcall" lines.
func spawnServer(t *testing.T, top, mode, db string) (*exec.Cmd, string, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+top+"$", "-test.count=1", "-test.timeout=300s")
	cmd.Env = append(os.Environ(), envServer+"="+mode, envDB+"="+db)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
			midcall := make(chan string, 64)
			go func() { // drains to the end, so the child never blocks on a full pipe
				for sc.Scan() {
					if strings.HasPrefix(sc.Text(), "midcall ") {
						select {
						case midcall <- sc.Text():
						default:
						}
					}
				}
			}()
			return cmd, addr, midcall
		}
	}
	require.FailNowf(t, "server ended before listening", "%s server", mode)
	return nil, "", nil
}

// crashServer is a server process of the crash tests.
func crashServer(t *testing.T, mode string, cdb crashDB, db string) {
	store, book, charge := cdb.open(t, db)
	e, err := core.New(store, core.WithLease(time.Second), core.WithWait(30*time.Second))
	require.NoError(t, err)
	ic, err := grpcidem.UnaryServerInterceptor(e, grpcidem.WithMethods(grpcidemtest.Charge),
		grpcidem.WithScope(func(context.Context) (string, error) { return "shop", nil }))
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic))
	grpcidemtest.Register(srv, func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		p := in.GetValue()
		if err := book(ctx, p); err != nil { // in the call's transaction
			return nil, err
		}
		// The provider: outside the transaction, deduplicating by relay key.
		if err := charge(ctx, core.RelayKey(ctx, "provider"), p); err != nil {
			return nil, err
		}
		if mode == "hang" {
			fmt.Printf("midcall %s\n", p)
			<-ctx.Done() // until SIGKILL
			return nil, ctx.Err()
		}
		return wrapperspb.String("booked " + p), nil
	}, func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return wrapperspb.String(mode), nil
	})
	fmt.Printf("listening %s\n", grpcidemtest.Serve(t, srv))
	<-make(chan struct{}) // serves until the parent kills it
}
