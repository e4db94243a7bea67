package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/nethttpidem"
)

// Config is one run of the demo.
type Config struct {
	// N is the number of concurrent duplicates in the burst.
	N int
	// Latency is how long the payment provider takes to charge.
	Latency time.Duration
}

// Result is what one protected server did.
type Result struct {
	Name string
	// Charges is how many times the provider charged the card.
	Charges int
	// Statuses counts the burst's responses by status code.
	Statuses map[int]int
	// Replayed counts the burst's responses marked Idempotent-Replayed.
	Replayed int
	// Mismatch is the answer to the same key with a different amount.
	MismatchStatus int
	MismatchBody   string
}

// Report is the outcome of Run.
type Report struct {
	Config  Config
	Key     string
	Results []Result // naive, idem, idem with wait
}

// Run starts the same payment handler three times on 127.0.0.1 — behind a
// naive response cache, behind idem, and behind idem in wait mode — fires
// the same burst of duplicates at each, then sends the key once more with a
// different amount.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.N < 2 {
		return Report{}, errors.New("racedemo: the burst needs at least 2 requests")
	}
	rep := Report{Config: cfg, Key: "pay-order-42"}
	setups := []struct {
		name string
		mw   func() (func(http.Handler) http.Handler, error)
	}{
		{"naive cache", func() (func(http.Handler) http.Handler, error) { return naiveCache(), nil }},
		{"idem", func() (func(http.Handler) http.Handler, error) { return idemMiddleware() }},
		{"idem + wait", func() (func(http.Handler) http.Handler, error) {
			return idemMiddleware(core.WithWait(10 * time.Second))
		}},
	}
	for _, s := range setups {
		mw, err := s.mw()
		if err != nil {
			return rep, err
		}
		res, err := runOne(ctx, cfg, rep.Key, mw)
		if err != nil {
			return rep, fmt.Errorf("racedemo: %s: %w", s.name, err)
		}
		res.Name = s.name
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// provider is the payment provider: slow, and it charges every call.
type provider struct {
	latency time.Duration
	charges atomic.Int64
}

func (p *provider) charge(ctx context.Context) (int64, error) {
	t := time.NewTimer(p.latency)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return p.charges.Add(1), nil
}

// paymentHandler charges the provider and answers 201 with the receipt.
func paymentHandler(p *provider) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Amount int64 `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
			http.Error(w, `{"error":"bad amount"}`, http.StatusBadRequest)
			return
		}
		n, err := p.charge(r.Context())
		if err != nil {
			http.Error(w, `{"error":"provider"}`, http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":"ch_%d","amount":%d}`+"\n", n, in.Amount)
	})
}

// naiveCache is the common, broken "cache the response" middleware: look
// the key up; on a miss run the handler and cache its response afterwards.
// Nothing claims the key before the handler runs (duplicates in flight all
// miss), and nothing compares the request (a different body under the same
// key gets the first answer).
func naiveCache() func(http.Handler) http.Handler {
	type cached struct {
		status int
		header http.Header
		body   []byte
	}
	var (
		mu    sync.Mutex
		cache = map[string]cached{} // Redis, in spirit
	)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get("Idempotency-Key")
			mu.Lock()
			c, hit := cache[key]
			mu.Unlock()
			if hit {
				for k, v := range c.header {
					w.Header()[k] = v
				}
				w.Header().Set("Idempotent-Replayed", "true")
				w.WriteHeader(c.status)
				_, _ = w.Write(c.body)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			mu.Lock()
			cache[key] = cached{rec.Code, rec.Header().Clone(), rec.Body.Bytes()}
			mu.Unlock()
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
		})
	}
}

func idemMiddleware(opts ...core.Option) (func(http.Handler) http.Handler, error) {
	// One demo client, no tenants: a shared key space is what this demo
	// means. A real service keys records per user (nethttpidem.WithScope).
	eng, err := core.New(memstore.New(), append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	if err != nil {
		return nil, err
	}
	return nethttpidem.New(eng)
}

// runOne serves the handler behind mw on a random 127.0.0.1 port and runs
// the burst and the mismatch against it.
func runOne(ctx context.Context, cfg Config, key string, mw func(http.Handler) http.Handler) (Result, error) {
	p := &provider{latency: cfg.Latency}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw(paymentHandler(p)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Result{}, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	url := "http://" + ln.Addr().String() + "/v1/payments"
	client := &http.Client{
		Timeout:   cfg.Latency + 15*time.Second,
		Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: cfg.N},
	}
	defer client.CloseIdleConnections()

	res := Result{Statuses: map[int]int{}}
	type answer struct {
		status   int
		replayed bool
		err      error
	}
	answers := make([]answer, cfg.N)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range cfg.N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			status, h, _, err := post(ctx, client, url, key, `{"amount":1000}`)
			answers[i] = answer{status, h.Get("Idempotent-Replayed") == "true", err}
		}()
	}
	close(start)
	wg.Wait()
	for _, a := range answers {
		if a.err != nil {
			return res, a.err
		}
		res.Statuses[a.status]++
		if a.replayed {
			res.Replayed++
		}
	}
	// The client, believing the charge failed, fixes the amount and retries
	// under the same key.
	status, _, body, err := post(ctx, client, url, key, `{"amount":50000}`)
	if err != nil {
		return res, err
	}
	res.MismatchStatus, res.MismatchBody = status, strings.TrimSpace(string(body))
	res.Charges = int(p.charges.Load())
	return res, nil
}

func post(ctx context.Context, c *http.Client, url, key, body string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// Print writes the report for a reader.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "%d concurrent POST /v1/payments with the same Idempotency-Key (%q), amount 1000;\n", r.Config.N, r.Key)
	fmt.Fprintf(w, "the payment provider takes %v per charge.\n\n", r.Config.Latency)
	fmt.Fprintf(w, "  %-12s %-8s %s\n", "", "charges", "responses to the burst")
	for _, res := range r.Results {
		fmt.Fprintf(w, "  %-12s %-8d %s\n", res.Name, res.Charges, statusLine(res))
	}
	fmt.Fprintf(w, "\nThen the same key with amount 50000:\n\n")
	for _, res := range r.Results {
		fmt.Fprintf(w, "  %-12s %d %s\n", res.Name, res.MismatchStatus, summarize(res.MismatchBody))
	}
	fmt.Fprintln(w)
	if len(r.Results) >= 2 {
		naive, idem := r.Results[0], r.Results[1]
		fmt.Fprintf(w, "The naive cache charged the card %d times and answered the 50000 request with the\n", naive.Charges)
		fmt.Fprintf(w, "1000 receipt. idem charged %d time: duplicates in flight got 409 (retry later), or,\n", idem.Charges)
		fmt.Fprintf(w, "with core.WithWait, waited and got the stored response; a different body under the key got 422.\n")
	}
}

func statusLine(res Result) string {
	codes := make([]int, 0, len(res.Statuses))
	for c := range res.Statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var b strings.Builder
	for i, c := range codes {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d x%d", c, res.Statuses[c])
	}
	if res.Replayed > 0 {
		fmt.Fprintf(&b, " (%d replayed)", res.Replayed)
	}
	return b.String()
}

// summarize shortens a problem+json body to its type.
func summarize(body string) string {
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal([]byte(body), &p) == nil && p.Type != "" {
		return "problem " + p.Type[strings.LastIndexByte(p.Type, '/')+1:]
	}
	if bytes.Contains([]byte(body), []byte(`"amount":1000`)) {
		return body + "   <- the first request's receipt: wrong answer"
	}
	return body
}
