package core_test

import (
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

func TestPolicyFollowsOptions(t *testing.T) {
	def := newEngine(t, memstore.New()).Policy()
	assert.Equal(t, "Idempotency-Key", def.Header)
	assert.True(t, def.KeyRequired)
	assert.Equal(t, []string{"PATCH", "POST"}, def.Methods)
	assert.Equal(t, 24*time.Hour, def.Retention)
	assert.Equal(t, 30*time.Second, def.Lease)
	assert.Equal(t, time.Duration(0), def.Wait)
	assert.Equal(t, core.ProblemBaseURI, def.ProblemBaseURI)
	assert.True(t, def.Replayed(201))
	assert.True(t, def.Replayed(400))
	assert.False(t, def.Replayed(409))
	assert.False(t, def.Replayed(502))

	p := newEngine(t, memstore.New(),
		core.WithHeader("x-request-key"), core.WithKeyRequired(false), core.WithMethods("post", "put", "delete"),
		core.WithRetention(90*time.Minute), core.WithLease(10*time.Second), core.WithWait(2*time.Second),
		core.WithCanonicalJSON(true), core.WithFingerprintHeaders("accept"), core.WithProblemBaseURI("https://example.com/p/"),
		core.WithOutcomePolicy(func(s int) core.Class {
			if s == 201 {
				return core.Final
			}
			return core.Retryable
		}),
	).Policy()
	assert.Equal(t, "X-Request-Key", p.Header)
	assert.False(t, p.KeyRequired)
	assert.Equal(t, []string{"DELETE", "POST", "PUT"}, p.Methods)
	assert.Equal(t, 90*time.Minute, p.Retention)
	assert.Equal(t, 10*time.Second, p.Lease)
	assert.Equal(t, 2*time.Second, p.Wait)
	assert.True(t, p.CanonicalJSON)
	assert.Equal(t, []string{"Accept"}, p.FingerprintHeaders)
	assert.True(t, p.Replayed(201))
	assert.False(t, p.Replayed(400))
}

// render returns the fragment as generic JSON, as a client reads it.
func render(t *testing.T, f *core.OpenAPIFragment) map[string]any {
	t.Helper()
	b, err := json.Marshal(f)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func TestOpenAPIFragmentFollowsOptions(t *testing.T) {
	def := render(t, newEngine(t, memstore.New()).OpenAPI())
	other := render(t, newEngine(t, memstore.New(), core.WithHeader("X-Key"), core.WithKeyRequired(false),
		core.WithRetention(2*time.Hour), core.WithWait(1500*time.Millisecond), core.WithMethods("PUT")).OpenAPI())

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

	param := def["components"].(map[string]any)["parameters"].(map[string]any)[core.OpenAPIKeyParameter].(map[string]any)
	assert.Equal(t, "Idempotency-Key", param["name"])
	assert.Equal(t, "header", param["in"])
	assert.Equal(t, true, param["required"])
	assert.Contains(t, param["description"], "expire 24h0m0s after first use")
	schema := param["schema"].(map[string]any)
	assert.Equal(t, core.KeyPattern, schema["pattern"])
	assert.Equal(t, 1.0, schema["minLength"])
	param2 := other["components"].(map[string]any)["parameters"].(map[string]any)[core.OpenAPIKeyParameter].(map[string]any)
	assert.Equal(t, "X-Key", param2["name"])
	assert.Equal(t, false, param2["required"])
	assert.Contains(t, param2["description"], "waits up to 1.5s")

	// Required keys publish missing-key among the 400s; optional ones do not.
	enum := func(doc map[string]any, code string) []any {
		r := doc["components"].(map[string]any)["responses"].(map[string]any)["IdemProblem"+code].(map[string]any)
		s := r["content"].(map[string]any)["application/problem+json"].(map[string]any)["schema"].(map[string]any)
		return s["allOf"].([]any)[1].(map[string]any)["properties"].(map[string]any)["type"].(map[string]any)["enum"].([]any)
	}
	assert.Contains(t, enum(def, "400"), core.ProblemBaseURI+core.ProblemMissingKey)
	assert.NotContains(t, enum(other, "400"), core.ProblemBaseURI+core.ProblemMissingKey)
	for code, name := range map[string]string{"409": core.ProblemInFlight, "422": core.ProblemPayloadMismatch,
		"413": core.ProblemBodyTooLarge, "503": core.ProblemStoreUnavailable, "401": core.ProblemScopeUnavailable} {
		assert.Contains(t, enum(def, code), core.ProblemBaseURI+name, code)
	}
}

func TestOpenAPIProtect(t *testing.T) {
	f := newEngine(t, memstore.New()).OpenAPI()
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

// TestKeyPatternMatchesParseKey: the published pattern accepts exactly the
// header values ParseKey accepts (up to the decoded length, which a pattern
// cannot count after unescaping: maxLength bounds the raw form).
func TestKeyPatternMatchesParseKey(t *testing.T) {
	re := regexp.MustCompile(core.KeyPattern)
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
			continue // ParseKey trims surrounding whitespace (OWS); the pattern describes the value
		}
		_, err := core.ParseKey([]string{v})
		assert.Equal(t, err == nil, re.MatchString(v), "value %q: ParseKey err=%v", v, err)
	}
	long := strings.Repeat("a", core.MaxKeyBytes)
	_, err := core.ParseKey([]string{long})
	assert.NoError(t, err)
	assert.True(t, re.MatchString(long))
}

func TestISO8601Duration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "PT0S", 24 * time.Hour: "PT24H", 90 * time.Second: "PT1M30S", 500 * time.Millisecond: "PT0.5S",
		49*time.Hour + 2*time.Minute + 3*time.Second: "PT49H2M3S", -time.Second: "-PT1S",
	} {
		assert.Equal(t, want, core.ISO8601Duration(d), d.String())
	}
}

// TestOpenAPIPublishesEveryProblem: each problem of the table a client can
// receive is described, under its status.
func TestOpenAPIPublishesEveryProblem(t *testing.T) {
	b, err := json.Marshal(newEngine(t, memstore.New()).OpenAPI())
	require.NoError(t, err)
	for _, p := range core.Problems() {
		name := strings.TrimPrefix(p.Type, core.ProblemBaseURI)
		if name == core.ProblemCanceled {
			assert.NotContains(t, string(b), name, "the 499 reaches no client")
			continue
		}
		assert.Contains(t, string(b), `"`+p.Type+`"`, name)
		assert.Contains(t, string(b), `"IdemProblem`+strconv.Itoa(p.Status)+`"`, name)
	}
}
