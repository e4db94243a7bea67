package grpcidemtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
	"github.com/idemkit/idem/grpcidem"
)

// NewStore returns a fresh, empty store for one test.
type NewStore func(t testing.TB) core.Store

// Run runs grpcidem's conformance suite on stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	t.Run("ReplayByteIdentical", func(t *testing.T) { replay(t, newStore(t)) })
	t.Run("ConcurrentDuplicates", func(t *testing.T) { duplicates(t, newStore(t)) })
	t.Run("InFlight", func(t *testing.T) { inFlight(t, newStore(t)) })
	t.Run("Refusals", func(t *testing.T) { refusals(t, newStore(t)) })
	t.Run("HandlerErrorReleases", func(t *testing.T) { handlerError(t, newStore(t)) })
	t.Run("ClientKeyAcrossRetries", func(t *testing.T) { clientRetries(t, newStore(t)) })
	t.Run("HandlerPanic", func(t *testing.T) { handlerPanic(t, newStore(t)) })
	t.Run("InFlightRetriedByPolicy", func(t *testing.T) { inFlightRetried(t, newStore(t)) })
}

// server runs the test service behind the interceptor on e; charge counts
// its runs and answers "charged <input> #<run>", or what h answers.
type server struct {
	addr string
	runs atomic.Int32
	h    Handler
	keys chan string
}

func start(t testing.TB, e *core.Engine, h Handler, opts ...grpcidem.Option) *server {
	t.Helper()
	s := &server{h: h, keys: make(chan string, 16)}
	ic, err := grpcidem.UnaryServerInterceptor(e, append([]grpcidem.Option{
		grpcidem.WithMethods(Charge),
		grpcidem.WithScope(func(context.Context) (string, error) { return "tenant", nil }),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ic))
	Register(srv, func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		n := s.runs.Add(1)
		if k, ok := core.KeyFromContext(ctx); ok {
			select {
			case s.keys <- k:
			default:
			}
		}
		if s.h != nil {
			return s.h(ctx, in)
		}
		return wrapperspb.String(fmt.Sprintf("charged %s #%d", in.GetValue(), n)), nil
	}, func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		return wrapperspb.String("found " + in.GetValue()), nil
	})
	s.addr = Serve(t, srv)
	return s
}

func engine(t testing.TB, s core.Store, opts ...core.Option) *core.Engine {
	t.Helper()
	e, err := core.New(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func withKey(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, grpcidem.KeyHeader, key)
}

func tctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// rawCodec keeps the bytes of each response it decodes.
type rawCodec struct {
	encoding.CodecV2
	last []byte
}

func (c *rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.last = data.Materialize()
	return c.CodecV2.Unmarshal(data, v)
}

func replay(t *testing.T, st core.Store) {
	s := start(t, engine(t, st), nil)
	cc := Dial(t, s.addr)
	codec := &rawCodec{CodecV2: encoding.GetCodecV2("proto")}
	var first, second wrapperspb.StringValue
	var hdr1, hdr2 metadata.MD
	in := wrapperspb.String("42")
	if err := cc.Invoke(withKey(tctx(t), "k1"), Charge, in, &first, grpc.Header(&hdr1), grpc.ForceCodecV2(codec)); err != nil {
		t.Fatal(err)
	}
	firstBytes := codec.last
	if err := cc.Invoke(withKey(tctx(t), "k1"), Charge, in, &second, grpc.Header(&hdr2), grpc.ForceCodecV2(codec)); err != nil {
		t.Fatal(err)
	}
	if n := s.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if first.GetValue() != "charged 42 #1" || !proto.Equal(&first, &second) {
		t.Fatalf("first %q, replay %q", first.GetValue(), second.GetValue())
	}
	if string(codec.last) != string(firstBytes) {
		t.Fatalf("replayed bytes %x differ from the first response's %x", codec.last, firstBytes)
	}
	if got := hdr2.Get(grpcidem.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Fatalf("replay header metadata %v: want %s: true", hdr2, grpcidem.ReplayedHeader)
	}
	if got := hdr1.Get(grpcidem.ReplayedHeader); len(got) != 0 {
		t.Fatalf("first response marked replayed: %v", hdr1)
	}
	rec, err := st.Get(tctx(t), "tenant", "k1")
	if err != nil || rec.Method != storekit.CallMethod || rec.Route != Charge {
		t.Fatalf("record %q %q, %v; want CALL %s", rec.Method, rec.Route, err, Charge)
	}
}

func duplicates(t *testing.T, st core.Store) {
	s := start(t, engine(t, st, core.WithWait(20*time.Second)), nil)
	cc := Dial(t, s.addr)
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]int{}
	for range n {
		wg.Go(func() {
			var out wrapperspb.StringValue
			if err := cc.Invoke(withKey(tctx(t), "dup"), Charge, wrapperspb.String("7"), &out); err != nil {
				t.Errorf("duplicate: %v", err)
				return
			}
			mu.Lock()
			seen[out.GetValue()]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if r := s.runs.Load(); r != 1 || len(seen) != 1 {
		t.Fatalf("handler ran %d times; callers saw %v; want one run, one answer", r, seen)
	}
}

func inFlight(t *testing.T, st core.Store) {
	started, release := make(chan struct{}), make(chan struct{})
	s := start(t, engine(t, st, core.WithRetryAfter(2*time.Second)), func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		close(started)
		<-release
		return wrapperspb.String("done " + in.GetValue()), nil
	})
	cc := Dial(t, s.addr)
	done := make(chan error, 1)
	go func() {
		var out wrapperspb.StringValue
		done <- cc.Invoke(withKey(tctx(t), "busy"), Charge, wrapperspb.String("1"), &out)
	}()
	<-started
	var out wrapperspb.StringValue
	var trailer metadata.MD
	err := cc.Invoke(withKey(tctx(t), "busy"), Charge, wrapperspb.String("1"), &out, grpc.Trailer(&trailer))
	if status.Code(err) != codes.Aborted {
		t.Errorf("in flight: %v; want Aborted", err)
	}
	if ra := trailer.Get(grpcidem.RetryAfterTrailer); len(ra) != 1 || ra[0] != "2" {
		t.Errorf("trailer %v: want %s: 2", trailer, grpcidem.RetryAfterTrailer)
	}
	if pb := trailer.Get(grpcidem.PushbackTrailer); len(pb) != 1 || pb[0] != "2000" {
		t.Errorf("trailer %v: want %s: 2000", trailer, grpcidem.PushbackTrailer)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

type downStore struct{ core.Store }

func (downStore) Claim(context.Context, storekit.ClaimRequest) (storekit.ClaimResult, error) {
	return storekit.ClaimResult{}, errors.New("connection refused")
}

func refusals(t *testing.T, st core.Store) {
	s := start(t, engine(t, st), nil)
	cc := Dial(t, s.addr)
	call := func(ctx context.Context, method, in string) error {
		var out wrapperspb.StringValue
		return cc.Invoke(ctx, method, wrapperspb.String(in), &out)
	}
	if err := call(withKey(tctx(t), "m"), Charge, "1"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		ctx  context.Context
		in   string
		want codes.Code
	}{
		{"mismatch", withKey(tctx(t), "m"), "2", codes.FailedPrecondition},
		{"missing key", tctx(t), "1", codes.InvalidArgument},
		{"invalid key", withKey(tctx(t), "a b"), "1", codes.InvalidArgument},
		{"two keys", withKey(withKey(tctx(t), "x"), "y"), "1", codes.InvalidArgument},
	} {
		if err := call(c.ctx, Charge, c.in); status.Code(err) != c.want {
			t.Errorf("%s: %v; want %v", c.name, err, c.want)
		}
	}
	if err := call(tctx(t), Lookup, "1"); err != nil {
		t.Errorf("unprotected method without a key: %v", err)
	}
	if n := s.runs.Load(); n != 1 {
		t.Errorf("charge ran %d times, want 1", n)
	}
	down := start(t, engine(t, downStore{st}), nil)
	if err := call2(t, down.addr, withKey(tctx(t), "d")); status.Code(err) != codes.Unavailable {
		t.Errorf("store down: %v; want Unavailable", err)
	}
	noScope := start(t, engine(t, st), nil, grpcidem.WithScope(func(context.Context) (string, error) {
		return "", errors.New("no token")
	}))
	if err := call2(t, noScope.addr, withKey(tctx(t), "s")); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no tenant: %v; want Unauthenticated", err)
	}
	if _, err := grpcidem.UnaryServerInterceptor(engine(t, st), grpcidem.WithMethods(Charge)); err == nil {
		t.Errorf("an interceptor without a scope on an engine without a shared key space was accepted")
	}
}

func call2(t *testing.T, addr string, ctx context.Context) error {
	var out wrapperspb.StringValue
	return Dial(t, addr).Invoke(ctx, Charge, wrapperspb.String("1"), &out)
}

func handlerError(t *testing.T, st core.Store) {
	var calls atomic.Int32
	s := start(t, engine(t, st), func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if calls.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "provider down")
		}
		return wrapperspb.String("ok " + in.GetValue()), nil
	})
	cc := Dial(t, s.addr)
	var out wrapperspb.StringValue
	if err := cc.Invoke(withKey(tctx(t), "e"), Charge, wrapperspb.String("1"), &out); status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "provider down" {
		t.Fatalf("handler error: %v; want the handler's status as is", err)
	}
	if err := cc.Invoke(withKey(tctx(t), "e"), Charge, wrapperspb.String("1"), &out); err != nil || out.GetValue() != "ok 1" {
		t.Fatalf("retry after a handler error: %q, %v; want a fresh run", out.GetValue(), err)
	}
}

// RetryServiceConfig retries Charge on UNAVAILABLE and ABORTED.
const RetryServiceConfig = `{"methodConfig": [{"name": [{"service": "` + Service + `"}],
	"retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s",
	"backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]}}]}`

// clientRetries: the client interceptor runs once per logical call and
// gRPC's retry policy re-sends its key; the first attempt fails
// (releasing the key), the retry runs the call.
func clientRetries(t *testing.T, st core.Store) {
	var calls atomic.Int32
	s := start(t, engine(t, st), func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if calls.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "first attempt fails")
		}
		return wrapperspb.String("ok " + in.GetValue()), nil
	})
	var made atomic.Int32
	cc := Dial(t, s.addr,
		grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor(grpcidem.WithKeyFunc(func() string {
			return fmt.Sprintf("key-%d", made.Add(1))
		}))),
		grpc.WithDefaultServiceConfig(RetryServiceConfig))
	var out wrapperspb.StringValue
	if err := cc.Invoke(tctx(t), Charge, wrapperspb.String("1"), &out); err != nil || out.GetValue() != "ok 1" {
		t.Fatalf("call with retries: %q, %v", out.GetValue(), err)
	}
	if m, r := made.Load(), s.runs.Load(); m != 1 || r != 2 {
		t.Fatalf("%d keys made, %d attempts run; want 1 key, 2 attempts", m, r)
	}
	if a, b := <-s.keys, <-s.keys; a != "key-1" || b != "key-1" {
		t.Fatalf("attempts carried keys %q and %q; want key-1 on both", a, b)
	}
	// A key the caller set is kept.
	if err := cc.Invoke(withKey(tctx(t), "mine"), Charge, wrapperspb.String("2"), &out); err != nil {
		t.Fatal(err)
	}
	if k := <-s.keys; k != "mine" || made.Load() != 1 {
		t.Fatalf("caller's key replaced by %q", k)
	}
}

// handlerPanic: a panicking handler answers Internal (without the panic
// value) and releases the key.
func handlerPanic(t *testing.T, st core.Store) {
	var calls atomic.Int32
	s := start(t, engine(t, st), func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if calls.Add(1) == 1 {
			panic("secret panic value")
		}
		return wrapperspb.String("ok " + in.GetValue()), nil
	})
	cc := Dial(t, s.addr)
	var out wrapperspb.StringValue
	err := cc.Invoke(withKey(tctx(t), "p"), Charge, wrapperspb.String("1"), &out)
	if status.Code(err) != codes.Internal || strings.Contains(err.Error(), "secret") {
		t.Fatalf("panicking handler: %v; want Internal without the panic value", err)
	}
	if err := cc.Invoke(withKey(tctx(t), "p"), Charge, wrapperspb.String("1"), &out); err != nil || out.GetValue() != "ok 1" {
		t.Fatalf("retry after a panic: %q, %v; want a fresh run", out.GetValue(), err)
	}
}

// inFlightRetried: a duplicate refused as in flight (Aborted, with
// gRPC's pushback) is retried by the client's retry policy after the
// pushback and gets the first call's response.
func inFlightRetried(t *testing.T, st core.Store) {
	e := engine(t, st, core.WithRetryAfter(time.Second))
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(_ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		close(started)
		<-release
		return wrapperspb.String("done " + in.GetValue()), nil
	}
	ic, err := grpcidem.UnaryServerInterceptor(e, grpcidem.WithMethods(Charge),
		grpcidem.WithScope(func(context.Context) (string, error) { return "tenant", nil }))
	if err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int32
	// Outside grpcidem: counts attempts, and lets the first call finish
	// once a duplicate has been refused.
	outer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		attempts.Add(1)
		resp, err := next(ctx, req)
		if status.Code(err) == codes.Aborted {
			once.Do(func() { close(release) })
		}
		return resp, err
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(outer, ic))
	Register(srv, h, h)
	cc := Dial(t, Serve(t, srv), grpc.WithDefaultServiceConfig(RetryServiceConfig))
	done := make(chan error, 1)
	go func() {
		var out wrapperspb.StringValue
		done <- cc.Invoke(withKey(tctx(t), "r"), Charge, wrapperspb.String("1"), &out)
	}()
	<-started
	var out wrapperspb.StringValue
	var hdr metadata.MD
	if err := cc.Invoke(withKey(tctx(t), "r"), Charge, wrapperspb.String("1"), &out, grpc.Header(&hdr)); err != nil {
		t.Fatalf("duplicate with a retry policy: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out.GetValue() != "done 1" || len(hdr.Get(grpcidem.ReplayedHeader)) != 1 || attempts.Load() < 3 {
		t.Fatalf("duplicate got %q (header %v) after %d attempts in all; want the first's response, replayed, after a refused attempt",
			out.GetValue(), hdr, attempts.Load())
	}
}
