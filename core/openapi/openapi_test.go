package openapi_test

import (
	"context"
	"encoding/json"
	"github.com/idemkit/idem/core/problem"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/openapi"
)

func newEngine(t *testing.T, opts ...core.Option) *core.Engine {
	t.Helper()
	eng, err := core.New(memstore.New(), append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	require.NoError(t, err)
	return eng
}

// render returns the fragment as generic JSON, as a client reads it.
func render(t *testing.T, f *openapi.Fragment) map[string]any {
	t.Helper()
	b, err := json.Marshal(f)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func TestFragmentFollowsOptions(t *testing.T) {
	def := render(t, openapi.New(newEngine(t).Policy()))
	other := render(t, openapi.New(newEngine(t, core.WithHeader("X-Key"), core.WithKeyRequired(false),
		core.WithRetention(2*time.Hour), core.WithWait(1500*time.Millisecond), core.WithMethods("PUT")).Policy()))

	ext := def["x-idempotency"].(map[string]any)
	assert.Equal(t, "PT24H", ext["retention"])
	assert.Equal(t, 86400.0, ext["retentionSeconds"])
	assert.Equal(t, "Idempotency-Key", ext["header"])
	assert.Equal(t, []any{"PATCH", "POST"}, ext["methods"])
	assert.Equal(t, "PT0S", ext["inFlightWait"])
	ext2 := other["x-idempotency"].(map[string]any)
	assert.Equal(t, "PT2H", ext2["retention"])
	assert.Equal(t, "PT1.5S", ext2["inFlightWait"])
	assert.Equal(t, []any{"PUT"}, ext2["methods"])

	param := def["components"].(map[string]any)["parameters"].(map[string]any)[openapi.KeyParameter].(map[string]any)
	assert.Equal(t, "Idempotency-Key", param["name"])
	assert.Equal(t, "header", param["in"])
	assert.Equal(t, true, param["required"])
	assert.Contains(t, param["description"], "expire 24h0m0s after first use")
	schema := param["schema"].(map[string]any)
	assert.Equal(t, openapi.KeyPattern, schema["pattern"])
	assert.Equal(t, 1.0, schema["minLength"])
	param2 := other["components"].(map[string]any)["parameters"].(map[string]any)[openapi.KeyParameter].(map[string]any)
	assert.Equal(t, "X-Key", param2["name"])
	assert.Equal(t, false, param2["required"])
	assert.Contains(t, param2["description"], "waits up to 1.5s")

	// Required keys publish missing-key among the 400s; optional ones do not.
	enum := func(doc map[string]any, code string) []any {
		r := doc["components"].(map[string]any)["responses"].(map[string]any)["IdemProblem"+code].(map[string]any)
		s := r["content"].(map[string]any)["application/problem+json"].(map[string]any)["schema"].(map[string]any)
		return s["allOf"].([]any)[1].(map[string]any)["properties"].(map[string]any)["type"].(map[string]any)["enum"].([]any)
	}
	assert.Contains(t, enum(def, "400"), problem.BaseURI+problem.MissingKey)
	assert.NotContains(t, enum(other, "400"), problem.BaseURI+problem.MissingKey)
	for code, name := range map[string]string{"409": problem.InFlight, "422": problem.PayloadMismatch,
		"413": problem.BodyTooLarge, "503": problem.StoreUnavailable, "401": problem.ScopeUnavailable} {
		assert.Contains(t, enum(def, code), problem.BaseURI+name, code)
	}
}

func TestProtect(t *testing.T) {
	f := openapi.New(newEngine(t).Policy())
	get := map[string]any{"responses": map[string]any{"200": map[string]any{"description": "ok"}}}
	assert.False(t, f.Protect("GET", get), "GET is not protected")
	assert.NotContains(t, get, "parameters")

	own400 := map[string]any{"type": "object"}
	post := map[string]any{"responses": map[string]any{
		"201": map[string]any{"description": "created"},
		"400": map[string]any{"description": "bad body", "content": map[string]any{
			"application/problem+json": map[string]any{"schema": own400}}},
		"502": map[string]any{"description": "provider failed"},
	}}
	require.True(t, f.Protect("post", post))
	assert.Equal(t, []any{map[string]any{"$ref": "#/components/parameters/IdemKey"}}, post["parameters"])
	rs := post["responses"].(map[string]any)
	assert.Contains(t, rs["201"].(map[string]any)["headers"], core.ReplayedHeader, "a 201 is stored and replayed")
	assert.NotContains(t, rs["502"].(map[string]any), "headers", "a 502 leaves the key retryable: never replayed")
	assert.Equal(t, map[string]any{"$ref": "#/components/responses/IdemProblem422"}, rs["422"])
	assert.Equal(t, map[string]any{"$ref": "#/components/responses/IdemProblem409"}, rs["409"])
	s400 := rs["400"].(map[string]any)["content"].(map[string]any)["application/problem+json"].(map[string]any)["schema"].(map[string]any)
	require.Contains(t, s400, "anyOf", "the operation's own 400 and idem's are both described")
	assert.Equal(t, own400, s400["anyOf"].([]any)[0])
	assert.Contains(t, rs["400"].(map[string]any)["headers"], core.ReplayedHeader, "a 400 is final: replayed")

	doc := f.Document("policy", "1")
	assert.Equal(t, "3.1.0", doc["openapi"])
	assert.Contains(t, doc, "x-idempotency")
}

// TestKeyPatternMatchesEngine: the published pattern accepts exactly the
// header values the engine accepts as a key, i.e. does not refuse with
// invalid-key (up to the decoded length, which a pattern cannot count after
// unescaping: maxLength bounds the raw form).
func TestKeyPatternMatchesEngine(t *testing.T) {
	eng := newEngine(t)
	ctx := context.Background()
	// accepted reports whether eng takes v as a key: anything but a 400
	// invalid-key (a valid key proceeds, or meets an earlier use of it).
	accepted := func(v string) bool {
		t.Helper()
		d, err := eng.Decide(ctx, core.Request{Method: http.MethodPost, Route: "/p", Target: "/p",
			Header: http.Header{"Idempotency-Key": {v}}, Body: strings.NewReader("{}")})
		require.NoError(t, err, "Decide on a memstore, value %q", v)
		if d.Outcome == core.Proceed {
			require.NoError(t, eng.Abort(ctx, d, nil))
		}
		if d.Problem == problem.InvalidKey {
			assert.Equal(t, http.StatusBadRequest, d.Response.Status)
			return false
		}
		return true
	}
	re := regexp.MustCompile(openapi.KeyPattern)
	cases := []string{"k1", `"k1"`, `"a b"`, `"a\"b"`, `"a\\b"`, `"a\nb"`, `a b`, `a"b`, `a,b`, `a\b`, `""`, `"`,
		`"abc`, `"a"b"`, "é", "\x7f", "~!#$%&'*+-.^_`|", `"a\xb"`, "8e03978e-40d5-43e8-bc93-6894a57f9324"}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("ab \"\\,!~\t\x7f\x01")
	for range 5000 {
		n := 1 + r.IntN(6)
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		if r.IntN(3) == 0 {
			b[0], b[n-1] = '"', '"'
		}
		cases = append(cases, string(b))
	}
	for _, v := range cases {
		if strings.Trim(v, " \t") != v {
			continue // the engine trims surrounding whitespace (OWS); the pattern describes the value
		}
		assert.Equal(t, accepted(v), re.MatchString(v), "value %q", v)
	}
	long := strings.Repeat("a", core.MaxKeyBytes)
	assert.True(t, accepted(long))
	assert.True(t, re.MatchString(long))
}

// TestISO8601Duration: the policy's durations are published in ISO 8601
// form (x-idempotency's retention, lease and inFlightWait).
func TestISO8601Duration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "PT0S", 24 * time.Hour: "PT24H", 90 * time.Second: "PT1M30S", 500 * time.Millisecond: "PT0.5S",
		49*time.Hour + 2*time.Minute + 3*time.Second: "PT49H2M3S", -time.Second: "-PT1S",
	} {
		ext := openapi.New(core.Policy{Retention: d, Lease: d, Wait: d}).Extension
		assert.Equal(t, want, ext["retention"], d.String())
		assert.Equal(t, want, ext["lease"], d.String())
		assert.Equal(t, want, ext["inFlightWait"], d.String())
	}
}

// TestPublishesEveryProblem: each problem of the table a client can
// receive is described, under its status.
func TestPublishesEveryProblem(t *testing.T) {
	b, err := json.Marshal(openapi.New(newEngine(t).Policy()))
	require.NoError(t, err)
	for _, p := range problem.All() {
		name := strings.TrimPrefix(p.Type, problem.BaseURI)
		if name == problem.Canceled {
			assert.NotContains(t, string(b), name, "the 499 reaches no client")
			continue
		}
		assert.Contains(t, string(b), `"`+p.Type+`"`, name)
		assert.Contains(t, string(b), `"IdemProblem`+strconv.Itoa(p.Status)+`"`, name)
	}
}

// TestHandBuiltPolicy: a Policy built by hand (no engine) names the default
// replay marker, core.ReplayedHeader.
func TestHandBuiltPolicy(t *testing.T) {
	f := openapi.New(core.Policy{Header: "Idempotency-Key", Methods: []string{http.MethodPost}, KeyRequired: true})
	assert.Equal(t, core.ReplayedHeader, f.Extension["replayedHeader"])
	op := map[string]any{"responses": map[string]any{"201": map[string]any{"description": "created"}}}
	require.True(t, f.Protect(http.MethodPost, op))
	assert.Contains(t, op["responses"].(map[string]any)["201"].(map[string]any)["headers"], core.ReplayedHeader)
}
