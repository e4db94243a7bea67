package chaos

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

const (
	lease          = 2 * time.Second
	waitInFlight   = time.Second      // instance 0's -wait (instance 1: 0s, 409 at once)
	attemptTimeout = 10 * time.Second // one HTTP attempt
	keyDeadline    = 90 * time.Second // one logical request, all its retries
	startTimeout   = 60 * time.Second
	stopTimeout    = 15 * time.Second
	workers        = 24
	users          = 20
	dupShare       = 0.30 // share of requests that are concurrent duplicates
	mismatchShare  = 0.02 // keys probed with another body after their 201
	maxReported    = 25   // individual failures reported before summarising
)

// Config is the run's size and shape.
type Config struct {
	Requests   int       // logical requests, duplicates included
	Frameworks [2]string // the two instances' -framework values
	Race       bool      // build the example with -race
}

// LoadConfig reads the Config from the environment (IDEM_CHAOS_REQUESTS,
// IDEM_CHAOS_FRAMEWORKS, IDEM_CHAOS_RACE); requests is the default size, a
// fifth of it with -short.
func LoadConfig(t *testing.T, requests int) Config {
	c := Config{Requests: requests, Frameworks: [2]string{"nethttp", "nethttp"}}
	if testing.Short() {
		c.Requests = max(10, requests/5)
	}
	if v := os.Getenv("IDEM_CHAOS_REQUESTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10 {
			t.Fatalf("IDEM_CHAOS_REQUESTS=%q: want an integer >= 10", v)
		}
		c.Requests = n
	}
	if v := os.Getenv("IDEM_CHAOS_FRAMEWORKS"); v != "" {
		f := strings.Split(v, ",")
		if len(f) != 2 {
			t.Fatalf("IDEM_CHAOS_FRAMEWORKS=%q: want two comma-separated -framework values", v)
		}
		c.Frameworks = [2]string{strings.TrimSpace(f[0]), strings.TrimSpace(f[1])}
	}
	c.Race = os.Getenv("IDEM_CHAOS_RACE") == "1"
	return c
}

// stats are the run's counters.
type stats struct {
	requests, duplicates, attempts                  atomic.Int64
	created, replays, conflicts, unavailable        atomic.Int64
	badGateway, serverErrors, connErrors, timeouts  atomic.Int64
	mismatchProbes, mismatches                      atomic.Int64
	kills, restarts, terminations                   atomic.Int64
	providerCalls, providerFailures, providerLosses atomic.Int64
}

// failures caps how many individual failures are reported.
type failures struct {
	t *testing.T
	n atomic.Int64
}

func (f *failures) errorf(format string, args ...any) {
	f.t.Helper()
	if f.n.Add(1) <= maxReported {
		f.t.Errorf(format, args...)
	}
}

func (f *failures) summary() {
	if n := f.n.Load(); n > maxReported {
		f.t.Errorf("... and %d more failures", n-maxReported)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ---------------------------------------------------------------- provider

// provider is the external fake payment provider. Like Stripe it
// deduplicates on the Idempotency-Key: the first call with a key charges,
// later ones return the same charge. Now and then it fails before charging,
// or charges and then fails to answer (the response is lost).
type provider struct {
	st   *stats
	fail *failures

	mu      sync.Mutex
	charges map[string]string // relay key -> charge id
	calls   map[string]int
	seq     int
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
		http.NotFound(w, r)
		return
	}
	p.st.providerCalls.Add(1)
	key := r.Header.Get("Idempotency-Key")
	var c struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
		To       string `json:"to"`
	}
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil || key == "" || c.Amount <= 0 {
		p.fail.errorf("provider: bad charge request: key %q, %+v, %v", key, c, err)
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	time.Sleep(time.Duration(mrand.IntN(20)) * time.Millisecond)
	roll := mrand.Float64()
	if roll < 0.01 {
		p.st.providerFailures.Add(1)
		http.Error(w, "provider down", http.StatusServiceUnavailable)
		return
	}
	p.mu.Lock()
	p.calls[key]++
	id, ok := p.charges[key]
	if !ok {
		p.seq++
		id = "ch_" + strconv.Itoa(p.seq)
		p.charges[key] = id
	}
	p.mu.Unlock()
	if roll < 0.02 {
		p.st.providerLosses.Add(1)
		http.Error(w, "charged, but the answer was lost", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%q}`, id)
}

// ---------------------------------------------------------------- instances

var listeningRE = regexp.MustCompile(`"msg":"listening".*?"addr":"([^"]+)"`)

// instance is one examples/payments process, restartable.
type instance struct {
	name string
	bin  string
	args []string
	env  []string
	log  *os.File

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	addr   atomic.Pointer[string] // nil while down
}

func (in *instance) base() (string, bool) {
	p := in.addr.Load()
	if p == nil {
		return "", false
	}
	return *p, true
}

func (in *instance) start() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	cmd := exec.Command(in.bin, append([]string{"-addr", "127.0.0.1:0", "-log", "json"}, in.args...)...)
	killWithParent(cmd)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, in.env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", in.name, err)
	}
	fmt.Fprintf(in.log, "--- %s start pid %d at %s\n", in.name, cmd.Process.Pid, time.Now().Format(time.RFC3339Nano))
	addrc := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(in.log, line)
			if m := listeningRE.FindStringSubmatch(line); m != nil {
				select {
				case addrc <- m[1]:
				default:
				}
			}
		}
	}()
	exited := make(chan struct{})
	go func() {
		<-scanned // Wait closes the pipe: read it all first
		_ = cmd.Wait()
		close(exited)
	}()
	in.cmd, in.exited = cmd, exited
	select {
	case a := <-addrc:
		base := "http://" + a
		if err := waitHealthy(base, exited); err != nil {
			in.killLocked()
			return fmt.Errorf("%s: %w", in.name, err)
		}
		in.addr.Store(&base)
		return nil
	case <-exited:
		return fmt.Errorf("%s exited before listening (see its log)", in.name)
	case <-time.After(startTimeout):
		in.killLocked()
		return fmt.Errorf("%s did not listen within %v", in.name, startTimeout)
	}
}

func waitHealthy(base string, exited <-chan struct{}) error {
	c := &http.Client{Timeout: 2 * time.Second}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		resp, err := c.Get(base + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before healthy")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("not healthy in time")
}

// kill SIGKILLs the process: no shutdown, no commit, no abort.
func (in *instance) kill() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.killLocked()
}

func (in *instance) killLocked() {
	in.addr.Store(nil)
	if in.cmd == nil {
		return
	}
	_ = in.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-in.exited:
	case <-time.After(stopTimeout):
	}
	fmt.Fprintf(in.log, "--- %s SIGKILLed at %s\n", in.name, time.Now().Format(time.RFC3339Nano))
	in.cmd = nil
}

// stop shuts the process down with SIGTERM (SIGKILL after stopTimeout).
func (in *instance) stop() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.addr.Store(nil)
	if in.cmd == nil {
		return nil
	}
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.exited:
		in.cmd = nil
		return nil
	case <-time.After(stopTimeout):
		in.killLocked()
		return fmt.Errorf("%s did not stop within %v of SIGTERM", in.name, stopTimeout)
	}
}

func (in *instance) running() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.cmd != nil
}

func buildPayments(t *testing.T, race bool) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build examples/payments: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "payments")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	// By import path: the example is a module of the workspace (go.work), not of this one.
	args = append(args, "github.com/idemkit/idem/examples/payments")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// ---------------------------------------------------------------- driver

type job struct {
	user, key, body string
	dup             bool
	probe           bool // send another body after the 201: expect 422
}

// keyState is what the driver saw for one key.
type keyState struct {
	job
	mu      sync.Mutex
	body201 []byte
	ct201   string
}

type driver struct {
	t     *testing.T
	st    *stats
	fail  *failures
	insts [2]*instance
	hc    *http.Client
}

type answer struct {
	status   int
	body     []byte
	ct       string
	replayed bool
	err      error
}

func (d *driver) post(base, user, key, body string) answer {
	req, err := http.NewRequest(http.MethodPost, base+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Idempotency-Key", key)
	resp, err := d.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{
		status: resp.StatusCode, body: b, ct: resp.Header.Get("Content-Type"),
		replayed: resp.Header.Get(core.ReplayedHeader) == "true", err: err,
	}
}

// pick returns the base URL of instance want, or of the other one when
// want is down; ok is false when both are down.
func (d *driver) pick(want int) (string, bool) {
	if b, ok := d.insts[want].base(); ok {
		return b, true
	}
	return d.insts[1-want].base()
}

func problemType(b []byte) string {
	var p problem.Details
	if json.Unmarshal(b, &p) != nil {
		return ""
	}
	return strings.TrimPrefix(p.Type, problem.BaseURI)
}

// paymentsProblems is the example's own problem type prefix.
const paymentsProblems = "https://idemkit.dev/examples/payments/problems/"

// retryable503 reports a 503 that asks for a retry with the same key: the
// store was unavailable (idem's problem), or the example could not record
// the provider's answer (its charge step) or was interrupted before
// booking. A connection killed at the wrong moment produces each of them.
func retryable503(b []byte) bool {
	var p problem.Details
	if json.Unmarshal(b, &p) != nil {
		return false
	}
	switch p.Type {
	case problem.BaseURI + problem.StoreUnavailable,
		paymentsProblems + "charge-not-recorded",
		paymentsProblems + "interrupted":
		return true
	}
	return false
}

// send is one logical request: retried, as a well-behaved client does,
// until a final answer or the key deadline.
func (d *driver) send(ks *keyState, want int) {
	deadline := time.Now().Add(keyDeadline)
	backoff := 20 * time.Millisecond
	for {
		if time.Now().After(deadline) {
			d.fail.errorf("%s/%s: no final answer within %v", ks.user, ks.key, keyDeadline)
			return
		}
		base, ok := d.pick(want)
		if !ok {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		d.st.attempts.Add(1)
		a := d.post(base, ks.user, ks.key, ks.body)
		retry := true
		switch {
		case a.err != nil:
			var ne net.Error
			if errors.As(a.err, &ne) && ne.Timeout() {
				d.st.timeouts.Add(1)
			} else {
				d.st.connErrors.Add(1)
			}
			want = mrand.IntN(2)
		case a.status == http.StatusCreated:
			retry = false
			d.st.created.Add(1)
			if a.replayed {
				d.st.replays.Add(1)
			}
			ks.mu.Lock()
			if ks.body201 == nil {
				ks.body201, ks.ct201 = a.body, a.ct
			} else if !bytes.Equal(ks.body201, a.body) {
				d.fail.errorf("%s/%s: two different 201 bodies:\n  %s\n  %s", ks.user, ks.key, ks.body201, a.body)
			}
			ks.mu.Unlock()
		case a.status == http.StatusConflict && problemType(a.body) == problem.InFlight:
			d.st.conflicts.Add(1)
		case a.status == http.StatusServiceUnavailable && retryable503(a.body):
			d.st.unavailable.Add(1)
		case a.status == http.StatusBadGateway:
			d.st.badGateway.Add(1) // provider failed: the key is retryable
		case a.status == http.StatusInternalServerError:
			d.st.serverErrors.Add(1) // ledger write failed (backend terminated): retryable
		default:
			d.fail.errorf("%s/%s: unexpected answer %d %s", ks.user, ks.key, a.status, a.body)
			return
		}
		if !retry {
			return
		}
		time.Sleep(backoff/2 + time.Duration(mrand.Int64N(int64(backoff))))
		backoff = min(backoff*2, 400*time.Millisecond)
	}
}

// probe sends another body under a completed key: it must be refused 422.
func (d *driver) probe(ks *keyState) {
	other := strings.Replace(ks.body, `"amount":`, `"amount":1`, 1)
	for range 50 {
		base, ok := d.pick(mrand.IntN(2))
		if !ok {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		d.st.mismatchProbes.Add(1)
		a := d.post(base, ks.user, ks.key, other)
		switch {
		case a.err != nil, a.status == http.StatusServiceUnavailable:
			time.Sleep(50 * time.Millisecond)
			continue
		case a.status == http.StatusUnprocessableEntity && problemType(a.body) == problem.PayloadMismatch:
			d.st.mismatches.Add(1)
		default:
			d.fail.errorf("%s/%s: other body after a 201: %d %s (want 422)", ks.user, ks.key, a.status, a.body)
		}
		return
	}
	d.fail.errorf("%s/%s: mismatch probe never got an answer", ks.user, ks.key)
}

// ---------------------------------------------------------------- the run

// LedgerRow is one row of the example's payments table.
type LedgerRow struct{ User, Charge string }

// Backend is the database the two instances share, and the test's view of
// it. Its connections are the test's own: Fault never kills them.
type Backend interface {
	// Name names the database in the summary ("PostgreSQL", "MariaDB", ...).
	Name() string
	// DSN is instance i's -dsn (i is 0 or 1; the two may name different
	// nodes of one cluster).
	DSN(i int) string
	// Fault kills one of the instances' database connections, chosen at
	// random (pg_terminate_backend, KILL CONNECTION); it returns how many it
	// killed (0 when none was open).
	Fault(ctx context.Context) (int, error)
	// Ledger reads the payments table: rows by payment id, and the row count.
	Ledger(ctx context.Context) (map[string]LedgerRow, int, error)
	// Records counts the idempotency records still processing, those of
	// them past their lease, and the failed ones.
	Records(ctx context.Context) (processing, lapsed, failed int, err error)
}

// RandomHex returns n random bytes, hex-encoded (names for schemas,
// databases, applications).
func RandomHex(n int) string { return randomHex(n) }

// Run is the chaos test: two examples/payments instances on b, an external
// fake provider, cfg.Requests requests of which 30% are concurrent
// duplicates, instance 1 SIGKILLed and restarted over and over, b.Fault
// every few hundred milliseconds; then the books are checked (see the
// package documentation).
func Run(t *testing.T, cfg Config, b Backend) {
	start := time.Now()
	st := &stats{}
	fail := &failures{t: t}

	prov := &provider{st: st, fail: fail, charges: map[string]string{}, calls: map[string]int{}}
	provSrv := httptest.NewServer(prov)
	t.Cleanup(provSrv.Close)

	bin := buildPayments(t, cfg.Race)
	t.Logf("built examples/payments in %v (race %v)", time.Since(start).Round(time.Millisecond), cfg.Race)

	var insts [2]*instance
	for i := range insts {
		f, err := os.Create(filepath.Join(t.TempDir(), fmt.Sprintf("instance-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		// Instance 0 waits for in-flight duplicates (pgstore's LISTEN/NOTIFY
		// watcher, its listener among the backends terminated at random;
		// mysqlstore polls); instance 1 answers them 409.
		wait := "0s"
		if i == 0 {
			wait = waitInFlight.String()
		}
		in := &instance{
			name: fmt.Sprintf("instance-%d(%s, wait %s)", i, cfg.Frameworks[i], wait), bin: bin, log: f,
			args: []string{"-framework", cfg.Frameworks[i], "-dsn", b.DSN(i), "-provider-url", provSrv.URL,
				"-lease", lease.String(), "-wait", wait},
		}
		insts[i] = in
		t.Cleanup(func() {
			if err := in.stop(); err != nil {
				t.Error(err)
			}
			f.Close()
			if t.Failed() {
				if b, err := os.ReadFile(f.Name()); err == nil {
					t.Logf("%s log (last 6000 bytes):\n%s", in.name, b[max(0, len(b)-6000):])
				}
			}
		})
		// One at a time: both migrate at start.
		if err := in.start(); err != nil {
			t.Fatal(err)
		}
	}

	tr := &http.Transport{MaxIdleConnsPerHost: workers * 2, ResponseHeaderTimeout: attemptTimeout}
	hc := &http.Client{Transport: tr, Timeout: attemptTimeout}
	t.Cleanup(tr.CloseIdleConnections)
	d := &driver{t: t, st: st, fail: fail, insts: insts, hc: hc}

	// Jobs: unique keys, dupShare of all requests being concurrent duplicates.
	uniq := int(float64(cfg.Requests)*(1-dupShare) + 0.5)
	dupProb := float64(cfg.Requests-uniq) / float64(uniq)
	keys := make([]*keyState, uniq)
	for i := range keys {
		j := job{
			user: "user-" + strconv.Itoa(mrand.IntN(users)),
			key:  "chaos-" + strconv.Itoa(i) + "-" + randomHex(4),
			dup:  mrand.Float64() < dupProb,
		}
		j.probe = mrand.Float64() < mismatchShare
		j.body = fmt.Sprintf(`{"amount":%d,"currency":"JPY","to":"r-%d"}`, 1+mrand.IntN(1_000_000), i)
		keys[i] = &keyState{job: j}
	}

	// Chaos: SIGKILL and restart instance 1, and kill a database
	// connection, as the load passes each of killAt (shares of the keys
	// handed out): however fast the machine, they land inside the load. More
	// connections die every 150–500ms while it runs.
	killAt := []float64{0.15, 0.4, 0.65}
	killNow, faultNow := make(chan struct{}), make(chan struct{})
	stop := make(chan struct{})
	var chaos sync.WaitGroup
	chaos.Go(func() {
		for range killNow {
			insts[1].kill()
			st.kills.Add(1)
			time.Sleep(100*time.Millisecond + time.Duration(mrand.Int64N(int64(500*time.Millisecond))))
			for attempt := 0; ; attempt++ {
				err := insts[1].start()
				if err == nil {
					st.restarts.Add(1)
					break
				}
				if attempt == 5 {
					fail.errorf("restart %s: %v", insts[1].name, err)
					for range killNow { // let the load go on
					}
					return
				}
				time.Sleep(time.Second)
			}
		}
	})
	chaos.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-faultNow:
			case <-time.After(150*time.Millisecond + time.Duration(mrand.Int64N(int64(350*time.Millisecond)))):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			n, err := b.Fault(ctx)
			cancel()
			if err != nil {
				fail.errorf("%s: kill a connection: %v", b.Name(), err)
				continue
			}
			st.terminations.Add(int64(n))
		}
	})

	// The load.
	jobs := make(chan *keyState)
	var load sync.WaitGroup
	for range workers {
		load.Go(func() {
			for ks := range jobs {
				want := mrand.IntN(2)
				st.requests.Add(1)
				if ks.dup {
					st.requests.Add(1)
					st.duplicates.Add(1)
					var both sync.WaitGroup
					both.Go(func() { d.send(ks, 1-want) })
					d.send(ks, want)
					both.Wait()
				} else {
					d.send(ks, want)
				}
				if ks.probe && ks.body201 != nil {
					d.probe(ks)
				}
			}
		})
	}
	loadStart := time.Now()
	for i, ks := range keys {
		if len(killAt) > 0 && i == int(killAt[0]*float64(len(keys))) {
			killAt = killAt[1:]
			killNow <- struct{}{} // once the previous restart is done
			faultNow <- struct{}{}
		}
		jobs <- ks
	}
	close(jobs)
	close(killNow)
	// Chaos runs while keys are being handed out; the last requests finish
	// (their retries included) against a stable pair.
	close(stop)
	chaos.Wait()
	if !insts[1].running() {
		if err := insts[1].start(); err != nil {
			t.Fatalf("final restart: %v", err)
		}
		st.restarts.Add(1)
	}
	load.Wait()
	loadTook := time.Since(loadStart)

	// Every key that got a 201 replays byte-identically, on both instances.
	var got201 []*keyState
	for _, ks := range keys {
		if ks.body201 != nil {
			got201 = append(got201, ks)
		}
	}
	// A connection the chaos killed may still sit idle in an instance's
	// pool (pgxpool pings only those idle for a second or more): the
	// replay that draws it gets the store-unavailable 503, "not
	// processed", and the pool drops it. A client retries such a 503 with
	// the same key; so does this check, once, and at most once per killed
	// connection.
	var finalReplays, deadConnRetries atomic.Int64
	replayJobs := make(chan *keyState)
	var rep sync.WaitGroup
	for range workers {
		rep.Go(func() {
			for ks := range replayJobs {
				for i, in := range insts {
					base, ok := in.base()
					if !ok {
						fail.errorf("instance %d down for the final replays", i)
						continue
					}
					a := d.post(base, ks.user, ks.key, ks.body)
					if a.err == nil && a.status == http.StatusServiceUnavailable && bytes.Contains(a.body, []byte("store-unavailable")) {
						deadConnRetries.Add(1)
						a = d.post(base, ks.user, ks.key, ks.body)
					}
					if a.err != nil || a.status != http.StatusCreated || !a.replayed || !bytes.Equal(a.body, ks.body201) || a.ct != ks.ct201 {
						fail.errorf("%s/%s final replay on %s: %d replayed %v ct %q %s %v (first 201: %s)",
							ks.user, ks.key, in.name, a.status, a.replayed, a.ct, a.body, a.err, ks.body201)
						continue
					}
					finalReplays.Add(1)
				}
			}
		})
	}
	for _, ks := range got201 {
		replayJobs <- ks
	}
	close(replayJobs)
	rep.Wait()
	if n, killed := deadConnRetries.Load(), st.terminations.Load(); n > killed {
		fail.errorf("%d final replays answered store-unavailable, more than the %d connections the chaos killed", n, killed)
	}

	// The books: one ledger row per key, with the 201's payment and charge.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ledger, ledgerRows, err := b.Ledger(ctx)
	if err != nil {
		t.Fatalf("read ledger: %v", err)
	}
	prov.mu.Lock()
	charges := len(prov.charges)
	// Relay keys are per record (core.RelayKey): find the one that made
	// the 201's charge. That every key was charged at most once is the
	// count of charges against the keys, below.
	relayOf := make(map[string]string, len(prov.charges))
	for relay, ch := range prov.charges {
		relayOf[ch] = relay
	}
	chargeOf := func(chargeID string) (string, int) {
		relay, ok := relayOf[chargeID]
		if !ok {
			return "", 0
		}
		return prov.charges[relay], prov.calls[relay]
	}
	perUser := map[string]int{}
	maxCalls := 0
	for _, ks := range got201 {
		var p struct {
			ID               string `json:"id"`
			ProviderChargeID string `json:"provider_charge_id"`
		}
		if err := json.Unmarshal(ks.body201, &p); err != nil || p.ID == "" {
			fail.errorf("%s/%s: 201 body %s: %v", ks.user, ks.key, ks.body201, err)
			continue
		}
		r, ok := ledger[p.ID]
		switch {
		case !ok:
			fail.errorf("%s/%s: payment %s answered 201 but has no ledger row", ks.user, ks.key, p.ID)
		case r.User != ks.user || r.Charge != p.ProviderChargeID:
			fail.errorf("%s/%s: ledger row %+v does not match the 201 %s", ks.user, ks.key, r, ks.body201)
		}
		ch, calls := chargeOf(p.ProviderChargeID)
		if ch == "" || ch != p.ProviderChargeID {
			fail.errorf("%s/%s: provider charge %q, 201 says %q", ks.user, ks.key, ch, p.ProviderChargeID)
		}
		maxCalls = max(maxCalls, calls)
		perUser[ks.user]++
	}
	prov.mu.Unlock()
	if len(got201) != uniq {
		fail.errorf("%d of %d keys got a 201", len(got201), uniq)
	}
	if ledgerRows != len(got201) || len(ledger) != ledgerRows {
		fail.errorf("%d ledger rows (%d distinct ids) for %d keys with a 201: want exactly one each", ledgerRows, len(ledger), len(got201))
	}
	if charges != len(got201) {
		fail.errorf("provider made %d charges for %d keys with a 201: want exactly one each", charges, len(got201))
	}

	// GET /v1/payments lists each user's payments once.
	for u, n := range perUser {
		base, _ := d.pick(0)
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/payments", nil)
		req.Header.Set("X-User-ID", u)
		resp, err := hc.Do(req)
		if err != nil {
			fail.errorf("list %s: %v", u, err)
			continue
		}
		var list []json.RawMessage
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil || len(list) != n {
			fail.errorf("list %s: %d payments (%v), want %d", u, len(list), err, n)
		}
	}

	// No record stuck in processing past its lease.
	processing, lapsed, failed, err := b.Records(ctx)
	if err != nil {
		t.Fatalf("read records: %v", err)
	}
	if processing != 0 || lapsed != 0 || failed != 0 {
		fail.errorf("records after the run: %d processing (%d past their lease), %d failed; want none", processing, lapsed, failed)
	}

	// The instances' logs: no panic, no data race.
	for _, in := range insts {
		b, err := os.ReadFile(in.log.Name())
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"panic:", "DATA RACE", "fatal error:"} {
			if bytes.Contains(b, []byte(bad)) {
				fail.errorf("%s log contains %q", in.name, bad)
			}
		}
	}
	fail.summary()

	summary := fmt.Sprintf("chaos on %s: %d requests (%d unique keys, %d concurrent duplicates) in %v on %d CPUs; "+
		"%d HTTP attempts; %d instance kills, %d restarts, %d database connections killed; "+
		"answers: %d 201 (%d of them replays), %d 409 in-flight, %d 503, %d 502, %d 500, %d connection errors, %d timeouts; "+
		"%d mismatch probes -> %d 422; provider: %d calls, %d charges, %d failures, %d lost answers, max %d calls for one key; "+
		"ledger rows %d; final replays %d/%d byte-identical (%d retried after a store-unavailable 503); records processing %d (past lease %d), failed %d; %d failures",
		b.Name(), st.requests.Load(), uniq, st.duplicates.Load(), loadTook.Round(time.Millisecond), runtime.NumCPU(),
		st.attempts.Load(), st.kills.Load(), st.restarts.Load(), st.terminations.Load(),
		st.created.Load(), st.replays.Load(), st.conflicts.Load(), st.unavailable.Load(), st.badGateway.Load(),
		st.serverErrors.Load(), st.connErrors.Load(), st.timeouts.Load(),
		st.mismatchProbes.Load(), st.mismatches.Load(),
		st.providerCalls.Load(), charges, st.providerFailures.Load(), st.providerLosses.Load(), maxCalls,
		ledgerRows, finalReplays.Load(), 2*len(got201), deadConnRetries.Load(), processing, lapsed, failed, fail.n.Load())
	t.Log(summary)
	_, embedded := b.(interface{ NoConnections() })
	if st.kills.Load() == 0 || (st.terminations.Load() == 0 && !embedded) {
		t.Errorf("the run had %d kills and %d connection kills: no chaos happened", st.kills.Load(), st.terminations.Load())
	}
}
