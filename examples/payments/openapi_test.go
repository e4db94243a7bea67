package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/openapi"
)

// The published description is checked by libopenapi-validator, a
// maintained OpenAPI 3.1 validator: the document against the OpenAPI 3.1
// JSON Schema it embeds (no network), and the server's real responses —
// fresh, replayed, and every idem problem we can provoke — against the
// document.

// testApp serves the example in process: memstore, the in-memory ledger and
// a simulated provider with the given latency.
func testApp(t *testing.T, cfg config, latency time.Duration) http.Handler {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	ml := newMemLedger()
	eng, err := core.New(ledgerStore{Store: memstore.New(), ledger: ml, log: log}, engineOptions(cfg, log)...)
	if err != nil {
		t.Fatal(err)
	}
	a := &app{svc: &Service{ledger: ml, provider: newSimProvider(latency, log, 0), log: log}, eng: eng, log: log}
	if a.openapi, err = openAPIJSON(eng, false); err != nil {
		t.Fatal(err)
	}
	h, err := netHTTPHandler(a)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func defaultConfig(t *testing.T, args ...string) config {
	t.Helper()
	cfg, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func fetchOpenAPI(t *testing.T, h http.Handler) []byte {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/openapi.json", nil))
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
		t.Fatalf("GET /openapi.json: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	return rec.Body.Bytes()
}

// newValidator parses spec and validates it as an OpenAPI 3.1 document.
func newValidator(t *testing.T, spec []byte) (validator.Validator, bool, []string) {
	t.Helper()
	doc, err := libopenapi.NewDocument(spec)
	if err != nil {
		t.Fatalf("libopenapi: %v", err)
	}
	if v := doc.GetVersion(); v != "3.1.0" {
		t.Errorf("openapi version %q, want 3.1.0", v)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("validator: %v", errs)
	}
	ok, verrs := v.ValidateDocument()
	var msgs []string
	for _, e := range verrs {
		msgs = append(msgs, e.Error())
		for _, se := range e.SchemaValidationErrors {
			msgs = append(msgs, "  "+se.Reason+" at "+se.FieldPath+" ("+se.KeywordLocation+")")
		}
	}
	return v, ok, msgs
}

func TestOpenAPIDocumentValid(t *testing.T) {
	h := testApp(t, defaultConfig(t), time.Second)
	spec := fetchOpenAPI(t, h)
	v, ok, msgs := newValidator(t, spec)
	if !ok {
		t.Fatalf("GET /openapi.json is not a valid OpenAPI 3.1 document:\n%s", strings.Join(msgs, "\n"))
	}

	// The validator is not a rubber stamp: the same document with a broken
	// key parameter (no "in") is refused.
	var broken map[string]any
	if err := json.Unmarshal(spec, &broken); err != nil {
		t.Fatal(err)
	}
	delete(broken["components"].(map[string]any)["parameters"].(map[string]any)[openapi.KeyParameter].(map[string]any), "in")
	bb, _ := json.Marshal(broken)
	if _, ok, _ := newValidator(t, bb); ok {
		t.Error("a parameter without \"in\" validated: the validator checks nothing")
	}

	// Real responses, checked against the document.
	check := func(what string, req *http.Request) *http.Response {
		t.Helper()
		rec := httptest.NewRecorder()
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(rec, req)
		resp := rec.Result()
		// The validator reads the request body again.
		vreq := req.Clone(req.Context())
		vreq.Body = io.NopCloser(bytes.NewReader(body))
		if ok, errs := v.ValidateHttpResponse(vreq, resp); !ok {
			for _, e := range errs {
				t.Errorf("%s: response %d %s does not match the document: %v", what, resp.StatusCode, rec.Body.String(), e)
			}
		}
		return resp
	}
	post := func(user, key, body string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if user != "" {
			r.Header.Set(userHeader, user)
		}
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		return r
	}
	good := `{"amount":1000,"currency":"JPY","to":"alice"}`
	if r := check("fresh", post("u1", "k1", good)); r.StatusCode != http.StatusCreated {
		t.Errorf("fresh: %d", r.StatusCode)
	}
	if r := check("replay", post("u1", "k1", good)); r.StatusCode != http.StatusCreated || r.Header.Get(core.ReplayedHeader) != "true" {
		t.Errorf("replay: %d %v", r.StatusCode, r.Header)
	}
	for _, c := range []struct {
		what, user, key, body string
		status                int
	}{
		{"mismatch", "u1", "k1", `{"amount":2,"currency":"JPY","to":"alice"}`, 422},
		{"missing key", "u1", "", good, 400},
		{"invalid key", "u1", "a b", good, 400},
		{"bad body", "u1", "k2", `{"amount":0}`, 400},
		{"bad body replayed", "u1", "k2", `{"amount":0}`, 400},
		{"no user", "", "k3", good, 401},
	} {
		if r := check(c.what, post(c.user, c.key, c.body)); r.StatusCode != c.status {
			t.Errorf("%s: %d, want %d", c.what, r.StatusCode, c.status)
		}
	}
	// In flight: two at once, one holds the key for the provider's second,
	// the other gets 409 with Retry-After; both answers match the document.
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := check("in flight", post("u2", "k4", good))
			codes[i] = r.StatusCode
			if r.StatusCode == http.StatusConflict && r.Header.Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After: %v", r.Header)
			}
		}()
	}
	wg.Wait()
	if codes[0]+codes[1] != http.StatusCreated+http.StatusConflict {
		t.Errorf("two concurrent duplicates: %v, want one 201 and one 409", codes)
	}
	check("list", func() *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/v1/payments", nil)
		r.Header.Set(userHeader, "u1")
		return r
	}())
}

// TestOpenAPIFollowsFlags: the published policy is the engine's, so it
// changes with the flags that configure the engine.
func TestOpenAPIFollowsFlags(t *testing.T) {
	policy := func(args ...string) (ext map[string]any, keyDesc string) {
		var doc map[string]any
		if err := json.Unmarshal(fetchOpenAPI(t, testApp(t, defaultConfig(t, args...), 0)), &doc); err != nil {
			t.Fatal(err)
		}
		p := doc["components"].(map[string]any)["parameters"].(map[string]any)[openapi.KeyParameter].(map[string]any)
		return doc["x-idempotency"].(map[string]any), p["description"].(string)
	}
	def, defDesc := policy()
	for k, want := range map[string]any{"retention": "PT24H", "lease": "PT30S", "inFlightWait": "PT0S", "header": "Idempotency-Key", "keyRequired": true} {
		if def[k] != want {
			t.Errorf("default %s = %v, want %v", k, def[k], want)
		}
	}
	other, otherDesc := policy("-retention", "2h", "-lease", "10s", "-wait", "1500ms")
	for k, want := range map[string]any{"retention": "PT2H", "lease": "PT10S", "inFlightWait": "PT1.5S", "retentionSeconds": 7200.0} {
		if other[k] != want {
			t.Errorf("with flags, %s = %v, want %v", k, other[k], want)
		}
	}
	if !strings.Contains(defDesc, "expire 24h0m0s") || !strings.Contains(otherDesc, "expire 2h0m0s") || !strings.Contains(otherDesc, "waits up to 1.5s") {
		t.Errorf("the key parameter's description does not follow the policy:\n%s\n%s", defDesc, otherDesc)
	}
	if _, err := parseFlags([]string{"-retention", "10s", "-lease", "30s"}, io.Discard); err != nil {
		t.Fatal(err) // parseFlags does not check it; core.New does
	}
	log := slog.New(slog.DiscardHandler)
	if _, err := core.New(memstore.New(), engineOptions(defaultConfig(t, "-retention", "10s"), log)...); err == nil {
		t.Error("a retention shorter than the lease was accepted")
	}
}
