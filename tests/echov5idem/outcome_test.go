package echov5idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// completeDownStore fails every Complete, as a database lost between the
// claim and the commit.
type completeDownStore struct{ *memstore.Store }

func (completeDownStore) Complete(context.Context, storekit.Fence, storekit.StoredResponse) error {
	return errors.New("db down at commit")
}

// TestStreamedCommitFailureCutsResponse: a flushed 201 whose outcome could
// not be recorded reaches the client broken, never complete, through
// echo's Recover too (which passes http.ErrAbortHandler on).
func TestStreamedCommitFailureCutsResponse(t *testing.T) {
	eng, err := core.New(completeDownStore{memstore.New()}, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.Use(middleware.Recover())
	e.POST("/pay", func(c *echo.Context) error {
		c.Response().WriteHeader(http.StatusCreated)
		_, _ = c.Response().Write([]byte(`{"id":"pay_1",`))
		http.NewResponseController(c.Response()).Flush()
		_, _ = c.Response().Write([]byte(`"status":"charged"}`))
		return nil
	}, mw(t, eng))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", "k")
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return // cut before the header
	}
	b, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err == nil {
		t.Fatalf("client got a complete %d %q for an outcome that was not recorded; want a broken response", res.StatusCode, b)
	}
}
