package core_test

import (
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

func fp(method, route, body string, canonical bool) string {
	return core.Fingerprint(core.FingerprintInput{Method: method, Route: route, Body: []byte(body), CanonicalJSON: canonical})
}

func TestFingerprint(t *testing.T) {
	base := fp("POST", "/pay", payBody, false)
	assert.Regexp(t, regexp.MustCompile(`^[0-9a-f]{64}$`), base)
	assert.Equal(t, base, fp("POST", "/pay", payBody, false), "deterministic")
	assert.Equal(t, base, fp("post", "/pay", payBody, false), "method is case-insensitive")
	// Pinned: a change of encoding would turn every in-flight retry into a
	// 422 on upgrade. Bump the version tag ("idem-fp-v1") deliberately.
	assert.Equal(t, base, core.Fingerprint(core.FingerprintInput{Method: "POST", Route: "/pay", Body: []byte(payBody)}))

	distinct := map[string]string{
		"base":         base,
		"method":       fp("PATCH", "/pay", payBody, false),
		"route":        fp("POST", "/pay/", payBody, false),
		"body":         fp("POST", "/pay", `{"amount":50000,"currency":"JPY","to":"alice"}`, false),
		"empty body":   fp("POST", "/pay", "", false),
		"shift r/b":    fp("POST", "/pa", "y"+payBody, false),
		"shift m/r":    fp("POS", "T/pay", payBody, false),
		"empty all":    fp("", "", "", false),
		"ws body":      fp("POST", "/pay", payBody+" ", false),
		"reorder body": fp("POST", "/pay", `{"currency":"JPY","amount":1000,"to":"alice"}`, false),
	}
	seen := map[string]string{}
	for name, v := range distinct {
		if prev, dup := seen[v]; dup {
			t.Errorf("fingerprint of %s equals that of %s", name, prev)
		}
		seen[v] = name
	}

	// nil and empty bodies are the same request.
	assert.Equal(t, fp("POST", "/pay", "", false), core.Fingerprint(core.FingerprintInput{Method: "POST", Route: "/pay"}))
}

func TestFingerprintHeaders(t *testing.T) {
	in := func(h http.Header, names ...string) string {
		return core.Fingerprint(core.FingerprintInput{Method: "POST", Route: "/r", Body: []byte("{}"), Header: h, Headers: names})
	}
	plain := in(nil)
	a := http.Header{"Accept": {"application/json"}, "X-Other": {"1"}}
	withAccept := in(a, "accept")
	assert.NotEqual(t, plain, withAccept)
	assert.Equal(t, withAccept, in(http.Header{"Accept": {"application/json"}, "X-Other": {"2"}}, "Accept"), "only named headers count")
	assert.NotEqual(t, withAccept, in(http.Header{"Accept": {"text/html"}}, "Accept"))
	assert.NotEqual(t, in(http.Header{}, "Accept"), plain, "a named header counts even when absent")
	assert.NotEqual(t, in(http.Header{"Accept": {"a", "b"}}, "Accept"), in(http.Header{"Accept": {"a,b"}}, "Accept"), "lines are kept apart")
	assert.NotEqual(t, in(http.Header{"Accept": {"ab"}}, "Accept"), in(http.Header{"Accept": {"a", "b"}}, "Accept"))
	assert.Equal(t,
		in(http.Header{"Accept": {"x"}, "X-V": {"1"}}, "X-V", "Accept"),
		in(http.Header{"Accept": {"x"}, "X-V": {"1"}}, "accept", "x-v"), "header order and case do not matter")
	assert.NotEqual(t,
		in(http.Header{"A": {"1"}, "B": {""}}, "A", "B"),
		in(http.Header{"A": {""}, "B": {"1"}}, "A", "B"))

	eng := newEngine(t, memstore.New(), core.WithFingerprintHeaders("Accept"))
	r1 := request("k", payBody)
	r1.Header.Set("Accept", "application/json")
	d := proceed(t, eng, r1)
	t.Cleanup(func() { _ = eng.Abort(t.Context(), d, nil) })
	r2 := request("k", payBody)
	r2.Header.Set("Accept", "text/csv")
	requireProblem(t, decide(t, eng, r2), http.StatusUnprocessableEntity, problem.PayloadMismatch)
}

func TestFingerprintCanonicalJSON(t *testing.T) {
	same := [][]string{
		{`{"a":1,"b":[true,null,"x"]}`, `{ "b" : [ true , null , "x" ] , "a" : 1 }`, "\n{\"b\":[true,null,\"x\"],\n\t\"a\":1}\n"},
		{`{"s":"<&>"}`, `{"s":"\u003c\u0026\u003e"}`},
		{`{"s":"é"}`, `{"s":"\u00e9"}`},
		{`[]`, ` [ ] `},
		{`"x"`, ` "x"`},
	}
	for _, group := range same {
		want := fp("POST", "/r", group[0], true)
		for _, b := range group[1:] {
			assert.Equal(t, want, fp("POST", "/r", b, true), "%q vs %q", group[0], b)
			assert.NotEqual(t, fp("POST", "/r", group[0], false), fp("POST", "/r", b, false), "raw mode keeps %q apart", b)
		}
	}
	different := [][2]string{
		{`{"amount":1000}`, `{"amount":50000}`},
		{`{"n":1}`, `{"n":1.0}`},
		{`{"n":1}`, `{"n":"1"}`},
		{`{"n":12345678901234567890}`, `{"n":12345678901234567891}`},
		{`{"a":1}`, `{"a":1,"a":1}`},
		{`{"a":5}`, `{"a":1,"a":5}`},
		{`{}`, `{}}`},
		{`{}`, `{} {}`},
		{`[1]`, `[1]]`},
		{"{\"to\":\"\xff\"}", "{\"to\":\"\xfe\"}"},
		{`{"to":"\ud800"}`, `{"to":"\udbff"}`},
		{`{"a":null}`, `{}`},
		{`{"a":[]}`, `{"a":{}}`},
		{`not json`, `not  json`},
	}
	for _, p := range different {
		assert.NotEqual(t, fp("POST", "/r", p[0], true), fp("POST", "/r", p[1], true), "%q vs %q merged", p[0], p[1])
	}
	// A body that is not JSON is fingerprinted raw, exactly as without the option.
	for _, b := range []string{"", "not json", `{"a":`, "{\"a\":\"\xff\"}", `{"a":1,"a":2}`} {
		assert.Equal(t, fp("POST", "/r", b, false), fp("POST", "/r", b, true), "%q", b)
	}
}
