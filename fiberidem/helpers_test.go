package fiberidem_test

import (
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberidem"
	"github.com/idemkit/idem/fiberidem/fiberidemtest"
)

// newEngine builds an engine on store (memstore when nil) with one key
// space for every caller.
func newEngine(tb testing.TB, store core.Store, opts ...core.Option) *core.Engine {
	tb.Helper()
	if store == nil {
		store = memstore.New()
	}
	eng, err := core.New(store, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	require.NoError(tb, err, "core.New")
	return eng
}

// mw builds the middleware, failing the test on a construction error.
func mw(tb testing.TB, eng *core.Engine, opts ...fiberidem.Option) fiber.Handler {
	tb.Helper()
	m, err := fiberidem.New(eng, opts...)
	require.NoError(tb, err, "fiberidem.New")
	return m
}

func tenantScope(c *fiber.Ctx) (string, error) {
	// c.Get aliases fasthttp's buffer; fiberidem copies what it keeps.
	return c.Get("X-Tenant"), nil
}

// The app, listener, client, request and replay check are fiberidemtest's,
// shared with the adapter's conformance run and tests/fiberidem.
var (
	newApp       = fiberidemtest.NewApp
	serve        = fiberidemtest.Serve
	client       = fiberidemtest.Client
	do           = fiberidemtest.Do
	sameResponse = fiberidemtest.SameResponse
)

type result = fiberidemtest.Result

// mustDo is do that fails the test on a transport error: call it from the
// test's goroutine only.
func mustDo(t *testing.T, c *http.Client, method, url, body string, headers ...string) result {
	t.Helper()
	r, err := do(c, method, url, body, headers...)
	require.NoError(t, err, "%s %s", method, url)
	return r
}
