package core_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/calltest"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

func TestCallMemstore(t *testing.T) {
	calltest.Run(t, func(testing.TB) core.Store { return memstore.New() })
}

// keyEchoStore fails every claim with an error that quotes the key, as a
// database error quoting the failing row does.
type keyEchoStore struct{ core.Store }

func (keyEchoStore) Claim(_ context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	return storekit.ClaimResult{}, errors.New(`duplicate row "` + req.Key + `"`)
}

// TestCallErrorsCarryNoKey: no error Call returns holds the raw key.
func TestCallErrorsCarryNoKey(t *testing.T) {
	const key = "S3NT1NEL-key-0042"
	e, err := core.New(keyEchoStore{memstore.New()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.Call(context.Background(), core.CallRequest{Scope: "s", Key: key, Name: "charge"},
		func(context.Context) ([]byte, error) { return nil, nil })
	if !errors.Is(err, core.ErrStoreUnavailable) || strings.Contains(err.Error(), "S3NT1NEL") {
		t.Fatalf("claim failure: %v; want ErrStoreUnavailable without the key", err)
	}
	if _, err := e.Call(context.Background(), core.CallRequest{Scope: "s", Key: "a b" + key, Name: "charge"},
		func(context.Context) ([]byte, error) { return nil, nil }); err == nil || strings.Contains(err.Error(), "S3NT1NEL") {
		t.Fatalf("invalid key: %v; want an error without the key", err)
	}
}

// TestCallAbortHandlerPanic: fn panicking with http.ErrAbortHandler (an
// httputil.ReverseProxy inside it, say) is a panic like any other: the key
// is released and Call returns a CallError, rather than panicking out of
// Call (http.ErrAbortHandler means "drop the connection" to an HTTP
// server, and a job or a gRPC server has none and crashes).
func TestCallAbortHandlerPanic(t *testing.T) {
	e, err := core.New(memstore.New())
	if err != nil {
		t.Fatal(err)
	}
	req := core.CallRequest{Scope: "s", Key: "k", Name: "charge"}
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Call panicked: %v", p)
			}
		}()
		_, err = e.Call(context.Background(), req, func(context.Context) ([]byte, error) { panic(http.ErrAbortHandler) })
	}()
	var ce *core.CallError
	if !errors.As(err, &ce) || ce.Problem != problem.HandlerPanic {
		t.Fatalf("Call = %v; want CallError %s", err, problem.HandlerPanic)
	}
	r, err := e.Call(context.Background(), req, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	if err != nil || r.Replayed || string(r.Value) != "ok" {
		t.Fatalf("retry = %+v, %v; want a fresh run", r, err)
	}
}
