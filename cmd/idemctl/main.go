package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/pgstore"
)

// Exit codes (see doc.go).
const (
	exitOK       = 0
	exitFailure  = 1
	exitUsage    = 2
	exitNotFound = 3
	exitRefused  = 4
	exitStuck    = 5
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

var usage = `usage: idemctl COMMAND [flags] [KEY]

commands:
  inspect   one record: status, token, lease, timestamps, response (body with -body)
  stuck     processing records past their lease, longest lapsed first (-fail: exit 5 if any)
  release   mark a stuck record failed, fenced by its token, so a retry runs now
  complete  send each stalled execution's kept request to the service (-url), as the client's
            retry would: it resumes from its steps and its response is stored (core/completer)
  sweep     delete expired records
  maintain  all retention work of the store's mode
  stats     counts by status and age
  schema    print a store's schema as plain SQL (STORE: ` + schemaStores + `), for goose, Flyway, Atlas
  version   the version idemctl was built from

the database: -dsn URL, default $DATABASE_URL: postgres://... or a key=value string (pgstore),
              mysql://user:pass@host:port/db (mysqlstore); or -mysql user:pass@tcp(host:port)/db;
              or -sqlite PATH (sqlitestore, an existing database file)
common flags: -schema (PostgreSQL), -table, -json, -timeout
run "idemctl COMMAND -h" for a command's flags

exit codes:
  0  success (stuck: also when records are stuck, unless -fail)
  1  failure: database unreachable, query failed
  2  usage: unknown command or flag, missing KEY or database
  3  record not found (inspect, release)
  4  release refused: the lease is live (see -live), or the record changed owner or state
  5  stuck -fail: at least one record is stuck past its lease

examples:
  export DATABASE_URL=postgres://idem@db/app     # or mysql://idem:secret@db:3306/app
  idemctl stats
  idemctl stuck -json                            # keys hashed; -show-keys to release one
  idemctl stuck -fail > /dev/null || alert-oncall "idem keys stuck"     # cron: exit 5 if any
  idemctl inspect -scope u1 -body -- "$KEY"
  printf '%s\n' "$KEY" | idemctl release -scope u1 -   # the key from stdin, not in ps
  idemctl complete -url http://payments.internal:8080   # finish orphaned executions now
  idemctl sweep -batch 5000
  idemctl schema postgres -schema idem > V1__idem.sql   # for goose, Flyway, Atlas
  idemctl schema mysql > 0001_idem.sql
  idemctl version`

// common are the flags every command takes.
type common struct {
	dsn, mysql, schema string
	sqlite             string
	table              string
	json               bool
	timeout            time.Duration
	margin             time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dsn, "dsn", os.Getenv("DATABASE_URL"), "postgres://... or key=value DSN (pgstore), or mysql://user:pass@host:port/db (mysqlstore); default $DATABASE_URL")
	fs.StringVar(&c.mysql, "mysql", "", "MySQL/MariaDB (mysqlstore): go-sql-driver DSN user:pass@tcp(host:port)/db, instead of -dsn")
	fs.StringVar(&c.sqlite, "sqlite", "", "SQLite (sqlitestore): path of an existing database file, instead of -dsn")
	fs.StringVar(&c.schema, "schema", "public", "schema of the store's tables (pgstore.WithSchema)")
	fs.StringVar(&c.table, "table", "idem_records", "records table (pgstore.WithTable)")
	fs.BoolVar(&c.json, "json", false, "print JSON, for scripts")
	fs.DurationVar(&c.timeout, "timeout", time.Minute, "give up after this long")
}

// cli is one invocation: its output streams and the key to keep out of
// them.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	secret         string // the key given on the command line, if any
}

// fail prints err (with the key redacted) and returns code.
func (c *cli) fail(code int, err error) int {
	// Every form of the key (quoted, escaped), whatever its length:
	// core's rule, the one idem's logs follow.
	fmt.Fprintln(c.stderr, "idemctl:", storekit.ScrubText(err.Error(), c.secret))
	return code
}

// codeOf maps an error to an exit code.
func codeOf(err error) int {
	switch {
	case errors.Is(err, storekit.ErrNotFound):
		return exitNotFound
	case errors.Is(err, storekit.ErrLeaseLive), errors.Is(err, core.ErrLeaseLost):
		return exitRefused
	}
	return exitFailure
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	if len(args) > 0 && (args[0] == "version" || args[0] == "-version" || args[0] == "--version") {
		return printVersion(stdout, args[1:], stderr)
	}
	if len(args) > 0 && args[0] == "schema" {
		return printSchema(stdout, args[1:], stderr)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintln(stderr, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("idemctl "+cmd, flag.ContinueOnError)
	// The flag package echoes the argument it refuses, and a KEY starting
	// with "-" is taken for a flag: its message is printed below, scrubbed.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage of %s:\n", fs.Name())
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	var com common
	com.register(fs)
	var (
		scope            string
		body, showKeys   bool
		limit, batch     int
		token            int64
		live, failStuck  bool
		wantKey, maxArgs int
		cf               completeFlags
	)
	switch cmd {
	case "inspect":
		fs.StringVar(&scope, "scope", "", "the record's scope (tenant)")
		fs.BoolVar(&body, "body", false, "show the stored response body")
		fs.BoolVar(&showKeys, "show-key", false, "print the key in clear")
		wantKey, maxArgs = 1, 1
	case "stuck":
		fs.IntVar(&limit, "limit", 100, "at most this many records")
		fs.BoolVar(&showKeys, "show-keys", false, "print keys in clear (needed to release one)")
		fs.BoolVar(&failStuck, "fail", false, "exit 5 when at least one record is stuck (for cron and alerting)")
	case "release":
		fs.StringVar(&scope, "scope", "", "the record's scope (tenant)")
		fs.Int64Var(&token, "token", 0, "release only under this lease token (from inspect or stuck); default: the current one")
		fs.BoolVar(&live, "live", false, "release even though the lease is still running (the owner is known dead)")
		wantKey, maxArgs = 1, 1
	case "complete":
		fs.StringVar(&cf.url, "url", "", "the service's base URL (http://host:port): each kept request is sent there")
		fs.StringVar(&cf.header, "header", "Idempotency-Key", "the service's key header (core.WithHeader)")
		fs.DurationVar(&cf.after, "after", 0, "only records whose lease lapsed at least this long ago")
		fs.DurationVar(&cf.maxAge, "max-age", 23*time.Hour, "skip records created longer ago (keep under the service's retention)")
		fs.IntVar(&cf.limit, "limit", 100, "at most this many stalled records")
	case "sweep":
		fs.IntVar(&batch, "batch", 1000, "records deleted per statement")
		fs.DurationVar(&com.margin, "margin", pgstore.DefaultRetentionMargin, "keep records this long past expiry (pgstore.WithRetentionMargin)")
	case "maintain":
		fs.DurationVar(&com.margin, "margin", pgstore.DefaultRetentionMargin, "keep records this long past expiry (pgstore.WithRetentionMargin)")
	case "stats":
	default:
		// Not echoed: it may be a KEY given without a command.
		fmt.Fprintf(stderr, "idemctl: unknown command (the first argument must be a command)\n%s\n", usage)
		return exitUsage
	}
	// Flags may come before or after the key.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			fmt.Fprintf(stderr, "idemctl %s: %s (a KEY that starts with \"-\" goes after \"--\", or on stdin as \"-\")\n",
				cmd, scrubArgs(err.Error(), fs, args))
			return exitUsage
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(positional) < wantKey || len(positional) > maxArgs {
		if wantKey > 0 {
			fmt.Fprintf(stderr, "idemctl %s: want exactly one KEY (\"-\" reads it from stdin)\n", cmd)
		} else {
			fmt.Fprintf(stderr, "idemctl %s: unexpected arguments\n", cmd)
		}
		return exitUsage
	}
	var key string
	if wantKey > 0 {
		key = positional[0]
		if key == "-" {
			line, err := bufio.NewReader(c.stdin).ReadString('\n')
			if err != nil && !errors.Is(err, io.EOF) {
				return c.fail(exitUsage, fmt.Errorf("read key from stdin: %w", err))
			}
			key = strings.TrimRight(line, "\r\n")
		}
		if key == "" {
			fmt.Fprintf(stderr, "idemctl %s: empty key\n", cmd)
			return exitUsage
		}
		c.secret = key
	}
	if com.dsn == "" && com.mysql == "" && com.sqlite == "" {
		fmt.Fprintf(stderr, "idemctl %s: no database: set -dsn (or DATABASE_URL: postgres://... or mysql://...), -mysql or -sqlite\n", cmd)
		return exitUsage
	}
	if cmd == "complete" && (!validServiceURL(cf.url) || cf.limit < 1 || cf.after < 0 || cf.maxAge <= cf.after) {
		fmt.Fprintf(stderr, "idemctl complete: want -url http(s)://host[:port], -limit > 0, 0 <= -after < -max-age\n")
		return exitUsage
	}
	if (cmd == "stuck" && limit < 1) || (cmd == "sweep" && batch < 1) {
		fmt.Fprintf(stderr, "idemctl %s: -limit and -batch must be positive\n", cmd)
		return exitUsage
	}

	ctx, cancel := context.WithTimeout(ctx, com.timeout)
	defer cancel()
	st, closeStore, err := openStore(ctx, com)
	if err != nil {
		return c.fail(codeOf(err), err)
	}
	defer closeStore()
	out := &printer{w: stdout, json: com.json, showKeys: showKeys, body: body}

	switch cmd {
	case "inspect":
		r, err := st.Inspect(ctx, scope, key)
		if err != nil {
			return c.fail(codeOf(err), fmt.Errorf("inspect %s: %w", describe(scope, key), err))
		}
		// Recovery points of an execution in progress (a stuck one: what a
		// takeover will resume from). Stores offer them only to the
		// current token of a processing record.
		var steps map[string][]byte
		if ss, ok := st.(storekit.StepStore); ok && r.Status == storekit.StatusProcessing {
			steps, _ = ss.LoadSteps(ctx, storekit.Fence{Scope: scope, Key: key, Token: r.Token})
		}
		return out.record(r, steps)
	case "stuck":
		rs, err := st.Stuck(ctx, limit)
		if err != nil {
			return c.fail(codeOf(err), err)
		}
		if code := out.records(rs); code != exitOK || !failStuck || len(rs) == 0 {
			return code
		}
		fmt.Fprintf(stderr, "idemctl stuck: %d record(s) stuck past their lease\n", len(rs))
		return exitStuck
	case "release":
		if token == 0 {
			r, err := st.Inspect(ctx, scope, key)
			if err != nil {
				return c.fail(codeOf(err), fmt.Errorf("release %s: %w", describe(scope, key), err))
			}
			token = r.Token
		}
		if err := st.Release(ctx, storekit.Fence{Scope: scope, Key: key, Token: token}, live); err != nil {
			return c.fail(codeOf(err), fmt.Errorf("release %s token %d: %w", describe(scope, key), token, err))
		}
		return out.released(scope, key, token)
	case "complete":
		rep, err := complete(ctx, st, cf)
		if err != nil {
			return c.fail(codeOf(err), err)
		}
		return out.completed(rep)
	case "sweep":
		total := 0
		for {
			n, err := st.Sweep(ctx, batch)
			total += n
			if err != nil {
				return c.fail(codeOf(err), fmt.Errorf("sweep (after deleting %d): %w", total, err))
			}
			if n < batch {
				break
			}
		}
		return out.count("deleted", total)
	case "maintain":
		if err := st.Maintain(ctx); err != nil {
			return c.fail(codeOf(err), err)
		}
		return out.count("maintained", 1)
	case "stats":
		s, err := st.Stats(ctx)
		if err != nil {
			return c.fail(codeOf(err), err)
		}
		return out.stats(s)
	}
	return exitUsage
}

// describe names a record for an error message, the key redacted.
func describe(scope, key string) string {
	return fmt.Sprintf("scope %q key %s", scope, core.RedactKey(key))
}

// scrubArgs scrubs msg (the flag package's error) of every argument that
// is not one of fs's flags: any of them may be the KEY.
func scrubArgs(msg string, fs *flag.FlagSet, args []string) string {
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && fs.Lookup(name) != nil {
			continue
		}
		msg = storekit.ScrubText(msg, a)
	}
	return msg
}
