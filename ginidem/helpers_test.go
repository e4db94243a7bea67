package ginidem_test

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/ginidem"
	"github.com/idemkit/idem/ginidem/ginidemtest"
)

const payBody = `{"amount":1000,"currency":"JPY","to":"alice"}`

func newEngine(tb testing.TB, opts ...core.Option) *core.Engine {
	tb.Helper()
	return newEngineOn(tb, memstore.New(), opts...)
}

func newEngineOn(tb testing.TB, s core.Store, opts ...core.Option) *core.Engine {
	tb.Helper()
	eng, err := core.New(s, append([]core.Option{core.WithSharedKeySpace()}, opts...)...)
	require.NoError(tb, err, "core.New")
	return eng
}

// mw builds the middleware, panicking on a construction error (tests only).
func mw(eng *core.Engine, opts ...ginidem.Option) gin.HandlerFunc {
	m, err := ginidem.New(eng, opts...)
	if err != nil {
		panic(err)
	}
	return m
}

// The in-process request, its response and the replay check are
// ginidemtest's, shared with tests/ginidem.
type (
	req      = ginidemtest.Request
	response = ginidemtest.Response
)

var (
	serve       = ginidemtest.Do
	checkReplay = ginidemtest.SameResponse
)

// checkProblem checks that r is a problem+json response of the given
// status and type name (problem.Details*).
func checkProblem(t *testing.T, r *response, status int, name string) {
	t.Helper()
	if !assert.Equal(t, status, r.Status, "status (%s); body %q", name, r.Body) {
		return
	}
	assert.Equal(t, "application/problem+json", r.Header.Get("Content-Type"))
	var p problem.Details
	if !assert.NoError(t, json.Unmarshal(r.Body, &p), "problem body %q", r.Body) {
		return
	}
	assert.Equal(t, problem.BaseURI+name, p.Type, "problem type")
}

var errCommitDown = errors.New("test: complete failed")

// failCompleteStore fails Complete (and Fail when failAll), as a database
// going away between claim and commit would.
type failCompleteStore struct {
	core.Store
	failAll bool
}

func (s failCompleteStore) Complete(context.Context, storekit.Fence, storekit.StoredResponse) error {
	return errCommitDown
}

func (s failCompleteStore) Fail(ctx context.Context, f storekit.Fence) error {
	if s.failAll {
		return errCommitDown
	}
	return s.Store.Fail(ctx, f)
}
