package echoidem_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/echoidem"
)

// failStore fails Complete (the outcome cannot be recorded) or Claim (the
// store is down).
type failStore struct {
	core.Store
	claim, finish bool
}

var errDown = errors.New("store down")

func (f failStore) Claim(ctx context.Context, r storekit.ClaimRequest) (storekit.ClaimResult, error) {
	if f.claim {
		return storekit.ClaimResult{}, errDown
	}
	return f.Store.Claim(ctx, r)
}

func (f failStore) Complete(ctx context.Context, fe storekit.Fence, r storekit.StoredResponse) error {
	if f.finish {
		return errDown
	}
	return f.Store.Complete(ctx, fe, r)
}

// TestStoreFailures: a store down at the claim (the handler never runs) or
// at the commit (its response is discarded, headers included) is answered
// by the default 503 problem or by the custom error handler, which gets the
// error and the fallback and may write or return an *echo.HTTPError.
func TestStoreFailures(t *testing.T) {
	for _, tc := range []struct {
		name       string
		store      failStore
		opts       []echoidem.Option
		wantStatus int
		wantBody   string // problem type, or exact body for custom handlers
		wantRuns   int32
	}{
		{"ClaimDefault", failStore{claim: true}, nil, 503, problem.StoreUnavailable, 0},
		{"CommitDefault", failStore{finish: true}, nil, 503, problem.StoreUnavailable, 1},
		{"ClaimCustomWrites", failStore{claim: true}, []echoidem.Option{echoidem.WithErrorHandler(
			func(c echo.Context, err error, fb *adapterkit.Response) error {
				assert.ErrorIs(t, err, errDown, "error handler's error")
				assert.Equal(t, http.StatusServiceUnavailable, fb.Status, "error handler's fallback")
				return c.String(http.StatusServiceUnavailable, "try later")
			})}, 503, "try later", 0},
		{"CommitCustomReturnsHTTPError", failStore{finish: true}, []echoidem.Option{echoidem.WithErrorHandler(
			func(_ echo.Context, err error, _ *adapterkit.Response) error {
				return echo.NewHTTPError(http.StatusServiceUnavailable, "not recorded").SetInternal(err)
			})}, 503, `{"message":"not recorded"}`, 1},
		{"NilErrorHandlerKeepsDefault", failStore{claim: true}, []echoidem.Option{echoidem.WithErrorHandler(nil), nil},
			503, problem.StoreUnavailable, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.store.Store = memstore.New()
			s := newServer(t, tc.store)
			var runs atomic.Int32
			s.E.POST("/x", func(c echo.Context) error {
				runs.Add(1)
				c.SetCookie(&http.Cookie{Name: "a", Value: "b"})
				return c.JSON(http.StatusCreated, map[string]int{"ok": 1})
			}, mw(s.Eng, tc.opts...))
			s.Start()
			r := s.Do("POST", "/x", "k", "")
			require.Equal(t, tc.wantStatus, r.Status, "got %v", r)
			if strings.HasPrefix(r.Header.Get("Content-Type"), "application/problem+json") {
				assert.Equal(t, tc.wantBody, problemType(t, r), "problem")
			} else {
				assert.Equal(t, tc.wantBody, strings.TrimSpace(string(r.Body)), "body")
			}
			assert.Empty(t, r.Header.Get("Set-Cookie"), "discarded response leaked a header: %v", r.Header)
			assert.Equal(t, tc.wantRuns, runs.Load(), "handler runs")
		})
	}
}
