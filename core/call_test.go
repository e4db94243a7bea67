package core_test

import (
	"context"
	"errors"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// TestCallStoppedByALostLeaseIsRetryable: when idem stops fn because its
// lease is gone (the heartbeat failed for a whole lease) and fn returns
// its context's error, as a handler that honours cancellation does, Call
// answers that the key is in flight (gRPC: Aborted, which a retry policy
// retries), not the bare context error, which reads as the caller having
// cancelled (gRPC: Canceled, never retried) though the key was released
// for a retry.
func TestCallStoppedByALostLeaseIsRetryable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New()
		e, err := core.New(&faultStore{Store: mem, heartbeat: func(context.Context, storekit.Fence, time.Duration) error {
			return errors.New("store unreachable")
		}}, core.WithLease(300*time.Millisecond))
		require.NoError(t, err)
		req := core.CallRequest{Scope: "s", Key: "k", Name: "charge"}
		_, err = e.Call(context.Background(), req, func(ctx context.Context) ([]byte, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		var ce *core.CallError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, problem.InFlight, ce.Problem)
		assert.ErrorIs(t, err, core.ErrLeaseLost)
		assert.ErrorIs(t, err, context.Canceled, "fn's own error is kept")

		// The key was released: a retry runs fn.
		e2, err := core.New(mem)
		require.NoError(t, err)
		res, err := e2.Call(context.Background(), req, func(context.Context) ([]byte, error) { return []byte("charged"), nil })
		require.NoError(t, err)
		assert.Equal(t, "charged", string(res.Value))
	})
}
