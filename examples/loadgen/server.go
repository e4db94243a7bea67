package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	startTimeout = 60 * time.Second
	stopTimeout  = 15 * time.Second
)

// idleParams make a server that is not being driven close its idle
// connections: the servers take turns (alternating rounds) and would
// otherwise hold servers × pool connections of the shared PostgreSQL at
// once. Every server gets the same; each measured chunk is preceded by an
// unmeasured warm-up that reconnects. The idle time outlasts a round: 2 s
// closed, during a server's own round, the connections a batching server
// used less often, which it then reopened for the next burst (pgxpool's
// default, 30 minutes, never would).
var idleParams = map[string]string{"pool_max_conn_idle_time": "15s", "pool_health_check_period": "1s"}

// withParams returns dsn with search_path, pool_max_conns and idleParams
// set, in URL or key=value form.
func withParams(dsn, schema string, pool int) (string, error) {
	if isMySQL(dsn) {
		return mysqlWithParams(dsn, schema, pool)
	}
	if isSQLite(dsn) {
		return sqliteScheme + schema, nil // schema is the file (newSchema)
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		q := u.Query()
		q.Set("search_path", schema)
		q.Set("application_name", schema) // finds the server's backends (cpu.go)
		q.Set("pool_max_conns", strconv.Itoa(pool))
		for k, v := range idleParams {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	out := fmt.Sprintf("%s search_path=%s application_name=%s pool_max_conns=%d", dsn, schema, schema, pool)
	for _, k := range []string{"pool_max_conn_idle_time", "pool_health_check_period"} {
		out += " " + k + "=" + idleParams[k]
	}
	return out, nil
}

// newSchema creates a fresh schema (a MySQL database, a SQLite file) and
// returns it with a function dropping it.
func newSchema(ctx context.Context, dsn string) (string, func(), error) {
	if isMySQL(dsn) {
		return newMySQLDatabase(ctx, dsn)
	}
	if isSQLite(dsn) {
		return newSQLiteFile(dsn)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", nil, fmt.Errorf("connect: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "loadgen_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		_ = conn.Close(ctx)
		return "", nil, fmt.Errorf("create schema: %w", err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := conn.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen: drop schema:", err)
		}
		_ = conn.Close(dctx)
	}
	return name, drop, nil
}

// textListening finds the address in slog's text form of the "listening"
// line (the example's default logging).
var textListening = regexp.MustCompile(`msg=listening addr=(\S+)`)

// child is a server process.
type child struct {
	cmd  *exec.Cmd
	base string // http://addr
	done chan error
}

// startChild starts bin with args and waits for its JSON "listening" log
// line on stderr, which carries the address. The rest of stderr is
// discarded (the payments example logs every decision).
func startChild(ctx context.Context, bin string, args ...string) (*child, error) {
	cmd := exec.Command(bin, args...)
	killWithParent(cmd)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan error, 1)}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		var last string
		for sc.Scan() {
			if sent {
				continue
			}
			last = sc.Text()
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" && line.Addr != "" {
				addrc <- line.Addr
				sent = true
			} else if m := textListening.FindStringSubmatch(last); m != nil {
				addrc <- m[1]
				sent = true
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		if !sent {
			addrc <- "exited: " + last
		}
	}()
	go func() { c.done <- cmd.Wait() }()
	t := time.NewTimer(startTimeout)
	defer t.Stop()
	select {
	case addr := <-addrc:
		if strings.HasPrefix(addr, "exited: ") {
			c.stop()
			return nil, fmt.Errorf("%s did not start (%s)", filepath.Base(bin), addr)
		}
		c.base = "http://" + addr
		return c, nil
	case <-t.C:
	case <-ctx.Done():
	}
	c.stop()
	return nil, fmt.Errorf("%s did not report its address within %v", filepath.Base(bin), startTimeout)
}

// stop asks the child to shut down (SIGTERM), killing it after stopTimeout.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// buildPayments builds examples/payments into dir.
func buildPayments(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "payments")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/idemkit/idem/examples/payments")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build examples/payments: %w", err)
	}
	return bin, nil
}

// payIn is a payment request's body.
type payIn struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	To       string `json:"to"`
}

// readPayment reads and validates the body like the example (a 400
// otherwise, already written).
func readPayment(w http.ResponseWriter, r *http.Request) ([]byte, payIn, bool) {
	var in payIn
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil || json.Unmarshal(body, &in) != nil || in.Amount <= 0 || len(in.Currency) != 3 || in.To == "" {
		http.Error(w, `{"status":400}`, http.StatusBadRequest)
		return nil, in, false
	}
	return body, in, true
}

// newChildLogger is the example's default logging (slog's text handler on
// stderr), or none.
func newChildLogger(format string, w io.Writer) *slog.Logger {
	switch format {
	case "none":
		return slog.New(slog.DiscardHandler)
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

// serveChild is the child mode: POST /v1/payments without idem ("baseline":
// one autocommit ledger INSERT per request) or through the article's design
// ("article"). Both log what the example's service logs per execution (the
// provider's charge, the booking) when logging is on.
func serveChild(ctx context.Context, kind, addr, dsn string, latency time.Duration, providerURL, logFormat string, logOut io.Writer) error {
	if kind == "provider" {
		return serveProvider(ctx, addr, latency, logOut)
	}
	log := newChildLogger(logFormat, logOut)
	// insertRow writes the ledger row (id, user_id, amount, currency,
	// recipient, provider_charge_id) in one autocommit INSERT; art is the
	// article's store (kind "article").
	var (
		insertRow func(ctx context.Context, args ...any) error
		art       *articleStore
	)
	switch {
	case isMySQL(dsn):
		ins, db, closeFn, err := mysqlLedger(ctx, dsn, kind)
		if err != nil {
			return err
		}
		defer closeFn()
		insertRow, art = ins, newArticleStore(sqlArticleDB{db}, "idempotency_keys", articleMySQL)
	case isSQLite(dsn):
		ins, db, err := sqliteLedger(ctx, dsn, kind)
		if err != nil {
			return err
		}
		defer db.Close()
		insertRow, art = ins, newArticleStore(sqlArticleDB{db}, "idempotency_keys", articleSQLite)
	default:
		pool, schema, ins, err := pgLedger(ctx, dsn, kind)
		if err != nil {
			return err
		}
		defer pool.Close()
		insertRow, art = ins, newArticleStore(pgxArticleDB{pool}, pgx.Identifier{schema, "idempotency_keys"}.Sanitize(), articlePostgres)
	}
	return serveBook(ctx, kind, addr, latency, providerURL, log, logOut, insertRow, art)
}

// pgLedger opens the pool, creates the ledger table (and the article's
// table for kind "article") in the DSN's search_path schema, and returns
// the ledger insert.
func pgLedger(ctx context.Context, dsn, kind string) (*pgxpool.Pool, string, func(ctx context.Context, args ...any) error, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, "", nil, err
	}
	schema, _, _ := strings.Cut(pcfg.ConnConfig.RuntimeParams["search_path"], ",")
	schema = strings.TrimSpace(schema)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, "", nil, err
	}
	table := pgx.Identifier{schema, "payments"}.Sanitize()
	ddl := []string{`CREATE TABLE IF NOT EXISTS ` + table + ` (
	id                 text        PRIMARY KEY,
	user_id            text        NOT NULL,
	amount             bigint      NOT NULL CHECK (amount > 0),
	currency           text        NOT NULL,
	recipient          text        NOT NULL,
	provider_charge_id text        NOT NULL,
	created_at         timestamptz NOT NULL DEFAULT now()
)`, `CREATE INDEX IF NOT EXISTS payments_user_idx ON ` + table + ` (user_id, created_at, id)`}
	if kind == "article" {
		ddl = append(ddl, articleDDL(pgx.Identifier{schema, "idempotency_keys"}.Sanitize(), articlePostgres)...)
	}
	for _, q := range ddl {
		if _, err := pool.Exec(ctx, q); err != nil {
			pool.Close()
			return nil, "", nil, err
		}
	}
	insert := `INSERT INTO ` + table + ` (id, user_id, amount, currency, recipient, provider_charge_id) VALUES ($1, $2, $3, $4, $5, $6)`
	return pool, schema, func(ctx context.Context, args ...any) error {
		_, err := pool.Exec(ctx, insert, args...)
		return err
	}, nil
}

// serveBook serves the child's endpoints until ctx ends; art is the
// article's store (kind "article").
func serveBook(ctx context.Context, kind, addr string, latency time.Duration, providerURL string, log *slog.Logger, logOut io.Writer,
	insertRow func(ctx context.Context, args ...any) error, art *articleStore) error {

	var provider *http.Client
	if providerURL != "" {
		provider = newProviderClient()
		defer provider.CloseIdleConnections()
	}
	// book is the business logic: the provider call (over HTTP with
	// -provider-url, else simulated), then the ledger row in one autocommit
	// INSERT with a random ID.
	book := func(ctx context.Context, user, key string, in payIn) (int, []byte, error) {
		var b [12]byte
		_, _ = rand.Read(b[:])
		chargeID := "ch_" + hex.EncodeToString(b[:])
		if provider != nil {
			if key == "" {
				key = chargeID
			}
			id, err := charge(ctx, provider, providerURL, key, in)
			if err != nil {
				return http.StatusBadGateway, []byte(`{"status":502}`), err
			}
			chargeID = id
		} else if latency > 0 {
			t := time.NewTimer(latency)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return http.StatusServiceUnavailable, nil, ctx.Err()
			}
		}
		p := struct {
			ID               string `json:"id"`
			Amount           int64  `json:"amount"`
			Currency         string `json:"currency"`
			To               string `json:"to"`
			ProviderChargeID string `json:"provider_charge_id"`
		}{"pay_" + hex.EncodeToString(b[:]), in.Amount, in.Currency, in.To, chargeID}
		log.InfoContext(ctx, "provider: card charged", "charge", p.ProviderChargeID, "amount", p.Amount, "currency", p.Currency)
		if err := insertRow(ctx, p.ID, user, p.Amount, p.Currency, p.To, p.ProviderChargeID); err != nil {
			return http.StatusInternalServerError, []byte(`{"status":500}`), err
		}
		log.InfoContext(ctx, "payment booked", "user", user, "payment", p.ID, "amount", p.Amount,
			"currency", p.Currency, "charge", p.ProviderChargeID)
		out, _ := json.Marshal(p)
		return http.StatusCreated, out, nil
	}

	mux := http.NewServeMux()
	switch kind {
	case "article":
		mux.Handle("POST /v1/payments", articleHandler(art, book, log))
	default:
		mux.HandleFunc("POST /v1/payments", func(w http.ResponseWriter, r *http.Request) {
			user := r.Header.Get("X-User-ID")
			if user == "" {
				http.Error(w, `{"status":401}`, http.StatusUnauthorized)
				return
			}
			_, in, ok := readPayment(w, r)
			if !ok {
				return
			}
			code, out, err := book(r.Context(), user, r.Header.Get("Idempotency-Key"), in)
			if err != nil {
				http.Error(w, `{"status":500}`, http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = w.Write(out)
		})
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"status":"ok"}`)) })

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	// The address, always as JSON, whatever the logging.
	slog.New(slog.NewJSONHandler(logOut, nil)).Info("listening", "addr", ln.Addr().String(), "server", kind)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
