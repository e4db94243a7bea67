package openapi

import (
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/problem"
)

// Names of the components a Fragment defines. They are prefixed "Idem" so
// they do not collide with an API's own components. The two header
// components are names under components.headers, not HTTP header names.
const (
	KeyParameter              = "IdemKey"        // components.parameters: the key header
	ReplayedHeaderComponent   = "IdemReplayed"   // components.headers: the replay marker (core.Policy.ReplayedHeader)
	RetryAfterHeaderComponent = "IdemRetryAfter" // components.headers: Retry-After
	ProblemSchema             = "IdemProblem"    // components.schemas: RFC 9457 problem details
)

const (
	problemResp        = "IdemProblem"   // components.responses: IdemProblem<status>
	extensionName      = "x-idempotency" // the policy, machine-readable, at the document root
	idempotencyDraft   = "draft-ietf-httpapi-idempotency-key-header"
	problemMediaType   = "application/problem+json"
	jsonSchemaDialect  = "https://spec.openapis.org/oas/3.1/dialect/base"
	openAPIVersion     = "3.1.0"
	keyPatternRaw      = `[!#-+\--\[\]-~]+`            // printable ASCII but space, '"', ',' and '\'
	keyPatternSF       = `"(?:[ !#-\[\]-~]|\\["\\])+"` // RFC 8941 sf-string, \" and \\ escapes
	keyHeaderMaxLength = 2*core.MaxKeyBytes + 2        // a quoted key with every byte escaped
)

// keyPattern is the ECMA-262 (and Go RE2) pattern of a valid key header
// value, as published in the key parameter's schema: a raw token or an
// RFC 8941 sf-string. The decoded key must also be 1 to core.MaxKeyBytes
// bytes.
const keyPattern = `^(?:` + keyPatternRaw + `|` + keyPatternSF + `)$`

// Fragment is a core.Policy rendered as OpenAPI 3.1: components to merge
// into an API description, the policy as the x-idempotency extension, and
// Protect to mark each operation idem guards. All values are JSON-ready
// (maps, slices, strings, numbers, booleans).
type Fragment struct {
	// Components holds "parameters", "headers", "schemas" and "responses",
	// each a map of component name to object.
	Components map[string]map[string]any `json:"components"`
	// Extension is the machine-readable policy (x-idempotency).
	Extension map[string]any `json:"x-idempotency"`

	policy core.Policy
}

// New renders p, usually an engine's (Engine.Policy), as an OpenAPI 3.1
// fragment: the key header parameter (format, length, whether it is
// required), the replay marker and Retry-After response headers, the
// problem details schema and one response per problem status, and the
// policy itself (methods, retention, lease, wait, fingerprint, limits) as
// x-idempotency.
func New(p core.Policy) *Fragment {
	f := &Fragment{policy: p, Components: map[string]map[string]any{
		"parameters": {KeyParameter: keyParameter(p)},
		"headers": {
			ReplayedHeaderComponent: map[string]any{
				"description": "Present, with the value true, when the response is the stored response of an earlier request " +
					"with the same key, replayed; the request was not processed again.",
				"schema": map[string]any{"type": "string", "const": "true"},
			},
			RetryAfterHeaderComponent: map[string]any{
				"description": "Seconds to wait before retrying with the same key.",
				"schema":      map[string]any{"type": "integer", "minimum": 1},
			},
		},
		"schemas":   {ProblemSchema: problemSchema()},
		"responses": {},
	}}
	byStatus := map[int][]problemSpec{}
	for _, ps := range publishedProblems(p) {
		byStatus[ps.status] = append(byStatus[ps.status], ps)
	}
	for status, specs := range byStatus {
		f.Components["responses"][problemResp+strconv.Itoa(status)] = problemResponse(p, status, specs)
	}
	f.Extension = extension(p)
	return f
}

// keyParameter is the key header as a parameter object.
func keyParameter(p core.Policy) map[string]any {
	var d strings.Builder
	d.WriteString("Idempotency key (" + idempotencyDraft + "): a Structured Field String (\"...\") or a raw token " +
		"of printable ASCII without spaces, 1 to " + strconv.Itoa(p.MaxKeyBytes) + " bytes; use a fresh random value " +
		"(a UUID) per operation and keep it across retries. ")
	if p.KeyRequired {
		d.WriteString("Required for " + strings.Join(p.Methods, ", ") + " requests. ")
	} else {
		d.WriteString("Optional for " + strings.Join(p.Methods, ", ") + " requests: without it the request is not protected. ")
	}
	d.WriteString("A retry with the same key and the same request gets the first response again, marked " +
		replayedHeader(p) + ": true; the same key with a different request is refused (422). ")
	if p.Wait > 0 {
		d.WriteString("A retry while the first request is in progress waits up to " + p.Wait.String() +
			" for it, then gets 409 with Retry-After. ")
	} else {
		d.WriteString("A retry while the first request is in progress gets 409 with Retry-After. ")
	}
	d.WriteString("Keys expire " + p.Retention.String() + " after first use; the same key is then a new request. " +
		"A request whose server stopped before finishing may be retried with the same key after " + p.Lease.String() + ".")
	return map[string]any{
		"name":        p.Header,
		"in":          "header",
		"required":    p.KeyRequired,
		"description": d.String(),
		"schema": map[string]any{
			"type":      "string",
			"minLength": 1,
			"maxLength": keyHeaderMaxLength,
			"pattern":   keyPattern,
		},
		"example": "8e03978e-40d5-43e8-bc93-6894a57f9324",
	}
}

func problemSchema() map[string]any {
	return map[string]any{
		"type":        "object",
		"description": "RFC 9457 problem details.",
		"required":    []any{"type", "title", "status"},
		"properties": map[string]any{
			"type":   map[string]any{"type": "string", "format": "uri"},
			"title":  map[string]any{"type": "string"},
			"status": map[string]any{"type": "integer", "minimum": 400, "maximum": 599},
			"detail": map[string]any{"type": "string"},
		},
	}
}

// problemResponse is the response object for one status: its problem types
// as an enum, and Retry-After where idem sends it.
func problemResponse(p core.Policy, status int, specs []problemSpec) map[string]any {
	var desc strings.Builder
	types := make([]any, 0, len(specs))
	for i, s := range specs {
		if i > 0 {
			desc.WriteString(" ")
		}
		uri := problem.BaseURI + s.name
		types = append(types, uri)
		desc.WriteString(uri + ": " + s.when + ".")
	}
	resp := map[string]any{
		"description": http.StatusText(status) + " (idempotency). " + desc.String(),
		"content": map[string]any{problemMediaType: map[string]any{"schema": map[string]any{
			"allOf": []any{
				map[string]any{"$ref": "#/components/schemas/" + ProblemSchema},
				map[string]any{"properties": map[string]any{
					"type":   map[string]any{"enum": types},
					"status": map[string]any{"const": status},
				}},
			},
		}}},
	}
	if status == http.StatusConflict || status == http.StatusServiceUnavailable {
		resp["headers"] = map[string]any{"Retry-After": map[string]any{"$ref": "#/components/headers/" + RetryAfterHeaderComponent}}
	}
	return resp
}

func extension(p core.Policy) map[string]any {
	body := "bytes"
	if p.CanonicalJSON {
		body = "canonical-json"
	}
	return map[string]any{
		"specification":       idempotencyDraft,
		"header":              p.Header,
		"keyRequired":         p.KeyRequired,
		"methods":             strSlice(p.Methods),
		"keyMaxBytes":         p.MaxKeyBytes,
		"retention":           iso8601Duration(p.Retention),
		"retentionSeconds":    p.Retention.Seconds(),
		"lease":               iso8601Duration(p.Lease),
		"leaseSeconds":        p.Lease.Seconds(),
		"inFlightWait":        iso8601Duration(p.Wait),
		"inFlightWaitSeconds": p.Wait.Seconds(),
		"replayedHeader":      replayedHeader(p),
		"replayHeaders":       strSlice(p.ReplayHeaders),
		"fingerprint": map[string]any{
			"algorithm": "sha-256",
			"fields":    []any{"method", "route", "target", "body"},
			"body":      body,
			"headers":   strSlice(p.FingerprintHeaders),
		},
		"maxRequestBytes":  p.MaxRequestBytes,
		"maxResponseBytes": p.MaxResponseBytes,
		"problemBaseURI":   problem.BaseURI,
	}
}

func strSlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// Protect marks op, the OpenAPI operation object served for method, as
// guarded by idem, and reports whether it did (false when the policy does
// not protect method: op is left alone). It adds the key parameter, idem's
// problem responses, and the replay marker (core.Policy.ReplayedHeader)
// to every response of op whose status the outcome policy stores and
// replays (core.Policy.Replayed). Where op already describes a problem
// status of its own (say its own 400), the content schemas are combined
// with anyOf. op's responses must be declared before Protect is called; op
// may be nil-mapped only in its sub-objects.
func (f *Fragment) Protect(method string, op map[string]any) bool {
	if op == nil || !f.policy.Protects(strings.ToUpper(method)) {
		return false
	}
	params, _ := op["parameters"].([]any)
	op["parameters"] = append(params, map[string]any{"$ref": "#/components/parameters/" + KeyParameter})
	responses, _ := op["responses"].(map[string]any)
	if responses == nil {
		responses = map[string]any{}
		op["responses"] = responses
	}
	// The API's own responses first: those replayed get the replay header.
	for code, r := range responses {
		status, err := strconv.Atoi(code)
		resp, ok := r.(map[string]any)
		if err != nil || !ok || !f.policy.Replayed(status) {
			continue
		}
		if _, isRef := resp["$ref"]; isRef {
			continue // a shared response object: the caller describes it
		}
		headers, _ := resp["headers"].(map[string]any)
		if headers == nil {
			headers = map[string]any{}
			resp["headers"] = headers
		}
		headers[replayedHeader(f.policy)] = map[string]any{"$ref": "#/components/headers/" + ReplayedHeaderComponent}
	}
	for _, name := range slices.Sorted(maps.Keys(f.Components["responses"])) {
		code := strings.TrimPrefix(name, problemResp)
		ref := map[string]any{"$ref": "#/components/responses/" + name}
		own, exists := responses[code].(map[string]any)
		if !exists {
			responses[code] = ref
			continue
		}
		f.mergeProblem(own, name)
	}
	return true
}

// mergeProblem folds idem's problem response name into the operation's own
// response for the same status.
func (f *Fragment) mergeProblem(own map[string]any, name string) {
	idem := f.Components["responses"][name].(map[string]any)
	if d, _ := own["description"].(string); d != "" {
		own["description"] = d + " Or: " + idem["description"].(string)
	}
	content, _ := own["content"].(map[string]any)
	if content == nil {
		content = map[string]any{}
		own["content"] = content
	}
	idemSchema := idem["content"].(map[string]any)[problemMediaType].(map[string]any)["schema"]
	mt, _ := content[problemMediaType].(map[string]any)
	if mt == nil {
		content[problemMediaType] = map[string]any{"schema": idemSchema}
	} else if s, ok := mt["schema"]; ok {
		mt["schema"] = map[string]any{"anyOf": []any{s, idemSchema}}
	} else {
		mt["schema"] = idemSchema
	}
	if h, ok := idem["headers"].(map[string]any); ok {
		headers, _ := own["headers"].(map[string]any)
		if headers == nil {
			headers = map[string]any{}
			own["headers"] = headers
		}
		for k, v := range h {
			if _, exists := headers[k]; !exists {
				headers[k] = v
			}
		}
	}
}

// AddTo merges the fragment's components and x-idempotency into doc, an
// OpenAPI document object. Components doc already defines under the same
// names are replaced.
func (f *Fragment) AddTo(doc map[string]any) {
	comps, _ := doc["components"].(map[string]any)
	if comps == nil {
		comps = map[string]any{}
		doc["components"] = comps
	}
	for kind, entries := range f.Components {
		m, _ := comps[kind].(map[string]any)
		if m == nil {
			m = map[string]any{}
			comps[kind] = m
		}
		maps.Copy(m, entries)
	}
	doc[extensionName] = f.Extension
}

// Document returns the fragment alone as a complete OpenAPI 3.1 document
// (no paths), for publishing the policy by itself.
func (f *Fragment) Document(title, version string) map[string]any {
	doc := map[string]any{
		"openapi":           openAPIVersion,
		"jsonSchemaDialect": jsonSchemaDialect,
		"info": map[string]any{
			"title":   title,
			"version": version,
		},
		"paths": map[string]any{},
	}
	f.AddTo(doc)
	return doc
}

// iso8601Duration writes d as an ISO 8601 duration ("PT24H", "PT1M30S",
// "PT0.5S"), the form the IETF draft's expiry and OpenAPI tooling read.
func iso8601Duration(d time.Duration) string {
	if d < 0 {
		return "-" + iso8601Duration(-d)
	}
	if d == 0 {
		return "PT0S"
	}
	var b strings.Builder
	b.WriteString("PT")
	h := d / time.Hour
	d -= h * time.Hour
	m := d / time.Minute
	d -= m * time.Minute
	if h > 0 {
		b.WriteString(strconv.FormatInt(int64(h), 10) + "H")
	}
	if m > 0 {
		b.WriteString(strconv.FormatInt(int64(m), 10) + "M")
	}
	if d > 0 {
		b.WriteString(strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "S")
	}
	return b.String()
}
