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

// withParams returns dsn with search_path and pool_max_conns set, in URL or
// key=value form.
func withParams(dsn, schema string, pool int) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		q := u.Query()
		q.Set("search_path", schema)
		q.Set("pool_max_conns", strconv.Itoa(pool))
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return fmt.Sprintf("%s search_path=%s pool_max_conns=%d", dsn, schema, pool), nil
}

// newSchema creates a fresh schema and returns it with a function dropping it.
func newSchema(ctx context.Context, dsn string) (string, func(), error) {
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

// serveBaseline is the child mode: POST /v1/payments without idem, one
// autocommit ledger INSERT per request.
func serveBaseline(ctx context.Context, addr, dsn string, latency time.Duration, logOut io.Writer) error {
	log := slog.New(slog.NewJSONHandler(logOut, nil))
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	schema, _, _ := strings.Cut(pcfg.ConnConfig.RuntimeParams["search_path"], ",")
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	table := pgx.Identifier{strings.TrimSpace(schema), "baseline_payments"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
	id                 text        PRIMARY KEY,
	user_id            text        NOT NULL,
	amount             bigint      NOT NULL CHECK (amount > 0),
	currency           text        NOT NULL,
	recipient          text        NOT NULL,
	provider_charge_id text        NOT NULL,
	created_at         timestamptz NOT NULL DEFAULT now()
)`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE INDEX IF NOT EXISTS baseline_payments_user_idx ON `+table+` (user_id, created_at, id)`); err != nil {
		return err
	}
	insert := `INSERT INTO ` + table + ` (id, user_id, amount, currency, recipient, provider_charge_id) VALUES ($1, $2, $3, $4, $5, $6)`

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payments", func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get("X-User-ID")
		if user == "" {
			http.Error(w, `{"status":401}`, http.StatusUnauthorized)
			return
		}
		var in struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
			To       string `json:"to"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&in); err != nil || in.Amount <= 0 || len(in.Currency) != 3 || in.To == "" {
			http.Error(w, `{"status":400}`, http.StatusBadRequest)
			return
		}
		if latency > 0 { // the provider call the example makes
			t := time.NewTimer(latency)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return
			}
		}
		var b [12]byte
		_, _ = rand.Read(b[:])
		p := struct {
			ID               string `json:"id"`
			Amount           int64  `json:"amount"`
			Currency         string `json:"currency"`
			To               string `json:"to"`
			ProviderChargeID string `json:"provider_charge_id"`
		}{"pay_" + hex.EncodeToString(b[:]), in.Amount, in.Currency, in.To, "ch_" + hex.EncodeToString(b[:])}
		if _, err := pool.Exec(r.Context(), insert, p.ID, user, p.Amount, p.Currency, p.To, p.ProviderChargeID); err != nil {
			http.Error(w, `{"status":500}`, http.StatusInternalServerError)
			return
		}
		out, _ := json.Marshal(p)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"status":"ok"}`)) })

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("listening", "addr", ln.Addr().String())
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
