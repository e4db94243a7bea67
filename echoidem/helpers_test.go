package echoidem_test

import (
	"encoding/json"
	"github.com/idemkit/idem/core/problem"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/echoidem"
	"github.com/idemkit/idem/echoidem/echoidemtest"
)

// mw builds the middleware, panicking on a construction error (tests only).
func mw(eng *core.Engine, opts ...echoidem.Option) echo.MiddlewareFunc {
	m, err := echoidem.New(eng, opts...)
	if err != nil {
		panic(err)
	}
	return m
}

// tenantScope is the scope option the tests use: the X-Tenant header.
func tenantScope() echoidem.Option {
	return echoidem.WithScope(func(c echo.Context) (string, error) {
		return c.Request().Header.Get("X-Tenant"), nil
	})
}

// The Echo app on a real listener, its requests and the replay check are
// echoidemtest's, shared with tests/echoidem.
type result = echoidemtest.Result

var (
	newServer   = echoidemtest.NewServer
	sameAsFirst = echoidemtest.SameResponse
)

// problemType returns the problem type name of a problem+json response.
func problemType(t *testing.T, r *result) string {
	t.Helper()
	assert.Equal(t, "application/problem+json", r.Header.Get("Content-Type"), "Content-Type of %v", r)
	var p problem.Details
	require.NoError(t, json.Unmarshal(r.Body, &p), "problem body %q", r.Body)
	assert.Equal(t, r.Status, p.Status, "problem status, response status")
	return strings.TrimPrefix(p.Type, problem.BaseURI)
}
