package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
)

// CallRequest names one call of Engine.Call.
type CallRequest struct {
	// Scope is the tenant the key belongs to. "" is refused (ErrNoScope)
	// unless the engine has WithSharedKeySpace. The engine's WithScope
	// function is not consulted: it reads HTTP requests.
	Scope string
	// Key identifies the logical operation: a message ID, a job ID, the
	// key a client sent. The rules of the HTTP header's unquoted form
	// apply: 1 to MaxKeyBytes printable ASCII bytes, no space, '"', ','
	// or '\' (ErrKeyInvalid otherwise; ErrKeyMissing when empty).
	Key string
	// Name names the operation ("charge", "/payments.v1.Payments/Charge"):
	// the record's route, part of the fingerprint. It must be its own
	// adapterkit.CanonicalRoute (no spaces, no ":id" parameters).
	Name string
	// Input is the operation's input (a message payload, a marshalled
	// request), fingerprinted and not kept (but for a completer that
	// registered Name, core/completer): the key reused with another
	// name or input is refused with ErrMismatch. Larger than the engine's
	// WithMaxRequestBytes it is refused (CallError, problem.BodyTooLarge).
	Input []byte
}

// CallResult is what Engine.Call returns: fn's result, or on a retry the
// stored one.
type CallResult struct {
	Value []byte
	// Replayed: fn did not run; Value is the result of an earlier call.
	Replayed bool
}

// CallError is every refusal and failure of Engine.Call that is idem's,
// not fn's: errors.Is matches it with ErrInFlight, ErrMismatch,
// ErrStoreUnavailable, ErrNotRetained, ErrKeyMissing, ErrKeyInvalid,
// ErrNoScope, and with its cause (ErrLeaseLost, ErrNotCommitted, a
// context error, the store's error).
type CallError struct {
	// Problem is the reason, a problem name as HTTP answers carry
	// (problem.InFlight, problem.PayloadMismatch, ...).
	Problem string
	// RetryAfter, for problem.InFlight, is when a retry may find the call
	// finished or its owner's lease lapsed.
	RetryAfter time.Duration
	// Err is the cause, when there is one.
	Err error
}

func (e *CallError) Error() string {
	msg := "idem: call refused: " + e.Problem
	if info, ok := problem.Lookup(e.Problem); ok {
		msg = "idem: call: " + info.Title
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap gives the sentinel of the problem and the cause.
func (e *CallError) Unwrap() []error {
	var errs []error
	switch e.Problem {
	case problem.InFlight:
		errs = append(errs, ErrInFlight)
	case problem.PayloadMismatch:
		errs = append(errs, ErrMismatch)
	case problem.StoreUnavailable:
		errs = append(errs, ErrStoreUnavailable)
	case problem.NotRetained:
		errs = append(errs, ErrNotRetained)
	case problem.MissingKey:
		errs = append(errs, ErrKeyMissing)
	case problem.ScopeUnavailable:
		errs = append(errs, ErrNoScope)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Call runs fn at most once per (req.Scope, req.Key) across every process
// sharing the engine's store, for work that is not an HTTP request: a
// queue consumer, a job, a gRPC method. It is an HTTP request to the
// engine (method storekit.CallMethod, route req.Name, body req.Input), so it has
// everything a request has: the lease and its heartbeat, fencing, the
// takeover of a crashed owner's key once its lease lapses, WithWait for
// duplicates, Step and RelayKey inside fn, and the transactional mode
// (pgstore.Tx, mysqlstore.Tx from fn's context commit with the result).
//
// fn runs on a context carrying the lease. Its result is recorded and
// returned; a retry with the same key gets it back (Replayed) without
// running fn. An error from fn releases the key (as a handler error does,
// retryable under the default outcome policy) and is returned as is, so a
// retry runs fn again: return a final business outcome (a declined card)
// as a result, not an error. If idem stopped fn because its lease was
// lost (fn's context cancelled with ErrLeaseLost), fn's error comes joined
// with a CallError (problem.InFlight): the caller retries rather than
// reading fn's context error as its own cancellation. A panic in fn
// releases the key and is returned as a CallError (problem.HandlerPanic)
// with the panic and stack.
//
// Every other failure is a *CallError (see its errors.Is matches). A call
// inside another call's or a request's fn is a call of its own, under its
// own lease.
func (e *Engine) Call(ctx context.Context, req CallRequest, fn func(context.Context) ([]byte, error)) (CallResult, error) {
	if fn == nil {
		return CallResult{}, errors.New("idem: call: nil function")
	}
	if req.Key == "" {
		return CallResult{}, &CallError{Problem: problem.MissingKey}
	}
	if k, err := parseKey([]string{req.Key}); err != nil || k != req.Key {
		if err == nil {
			err = keyErr("quoted key (pass the key itself)")
		}
		return CallResult{}, &CallError{Problem: problem.InvalidKey, Err: err}
	}
	if req.Name == "" || adapterkit.CanonicalRoute(req.Name) != req.Name {
		return CallResult{}, fmt.Errorf("idem: call: invalid name %q: not empty, and its own adapterkit.CanonicalRoute", req.Name)
	}
	if _, nested := leaseFrom(ctx); nested {
		// Decide lets a request inside an owned one through unclaimed;
		// a call is claimed on its own key, so hide the outer lease.
		ctx = context.WithValue(ctx, storekit.LeaseContextKey, nil)
	}
	input := req.Input
	if input == nil {
		input = []byte{}
	}
	d, err := e.Decide(ctx, Request{
		Method: storekit.CallMethod, Route: req.Name, Target: req.Name,
		Header: http.Header{e.cfg.header: {req.Key}},
		Body:   adapterkit.BodyBytes(func() []byte { return input }), Scope: req.Scope, call: true,
	})
	if err != nil {
		return CallResult{}, &CallError{Problem: problem.StoreUnavailable, Err: err}
	}
	switch d.Outcome {
	case Replay:
		if d.Response.Status != http.StatusOK {
			// A failure the outcome policy made final.
			return CallResult{}, &CallError{Problem: problem.HandlerError,
				Err: fmt.Errorf("idem: call: the first call failed finally (status %d)", d.Response.Status)}
		}
		return CallResult{Value: bytes.Clone(d.Response.Body), Replayed: true}, nil
	case Reject:
		return CallResult{}, e.callRefusal(ctx, d)
	case Proceed:
	default:
		return CallResult{}, fmt.Errorf("idem: call: unexpected outcome %v", d.Outcome)
	}
	x := &callExchange{fn: fn, max: e.cfg.maxResponse}
	if err := e.run(ctx, d, x); err != nil {
		cerr := callCommitError(err)
		if x.err != nil {
			return CallResult{}, errors.Join(x.err, cerr)
		}
		return CallResult{}, cerr
	}
	switch {
	case x.panicked != nil:
		return CallResult{}, &CallError{Problem: problem.HandlerPanic, Err: x.panicked}
	case x.err != nil:
		if lost := d.lostLease(); lost != nil {
			// idem stopped fn (its lease is gone) and released the key:
			// the caller's answer is "retry", not fn's context error,
			// which reads as the caller having cancelled.
			return CallResult{}, errors.Join(x.err, &CallError{Problem: problem.InFlight, Err: lost})
		}
		return CallResult{}, x.err
	}
	return CallResult{Value: x.fnOut}, nil
}

// callRefusal is the CallError of a Reject decision.
func (e *Engine) callRefusal(ctx context.Context, d *Decision) error {
	ce := &CallError{Problem: d.Problem}
	switch d.Problem {
	case problem.InFlight:
		if s, err := strconv.Atoi(d.Response.Header.Get("Retry-After")); err == nil {
			ce.RetryAfter = time.Duration(s) * time.Second
		}
	case problem.Canceled:
		ce.Err = context.Cause(ctx)
	}
	return ce
}

// callCommitError classifies a failed Commit or Abort as CommitErrorResponse does.
func callCommitError(err error) error {
	switch {
	case errors.Is(err, ErrLeaseLost):
		return &CallError{Problem: problem.InFlight, Err: err}
	case errors.Is(err, storekit.ErrNotCommitted):
		return &CallError{Problem: problem.HandlerError, Err: err}
	}
	return &CallError{Problem: problem.StoreUnavailable, Err: err}
}

// CallJSON is Call for a value of any type, recorded as its JSON encoding
// and decoded into a T on a retry: keep T's JSON form compatible across
// releases. Use Call to learn whether the value was replayed.
func CallJSON[T any](ctx context.Context, e *Engine, req CallRequest, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if fn == nil {
		return zero, errors.New("idem: call: nil function")
	}
	res, err := e.Call(ctx, req, func(ctx context.Context) ([]byte, error) {
		v, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("idem: call: encode result: %w", err)
		}
		return b, nil
	})
	if err != nil {
		return zero, err
	}
	var v T
	if err := json.Unmarshal(res.Value, &v); err != nil {
		return zero, fmt.Errorf("idem: call: decode stored result: %w", err)
	}
	return v, nil
}

// callExchange is a call as Run sees it: Next runs fn, the result is the
// response body (status 200), and nothing is written anywhere.
type callExchange struct {
	fn       func(context.Context) ([]byte, error)
	max      int
	fnOut    []byte // fn's result, returned to the caller
	out      []byte // its copy, recorded
	err      error  // fn's
	panicked error
}

func (x *callExchange) Next(ctx context.Context, _ *adapterkit.Proceed) error {
	out, err := x.fn(ctx)
	if err != nil {
		x.err = err
		return err
	}
	if out == nil {
		out = []byte{}
	}
	x.fnOut, x.out = out, bytes.Clone(out) // the store keeps the copy; the caller gets fn's own slice
	return nil
}

func (x *callExchange) Captured() adapterkit.Response {
	if x.err != nil {
		return adapterkit.Response{}
	}
	return adapterkit.Response{Status: http.StatusOK, Body: x.out, Truncated: len(x.out) > x.max}
}

func (x *callExchange) Send() error                                             { return nil }
func (x *callExchange) Discard() bool                                           { return true }
func (x *callExchange) Write(*adapterkit.Response) error                        { return nil }
func (x *callExchange) Panicked(cause error)                                    { x.panicked = cause }
func (x *callExchange) OnError(err error, _ *adapterkit.Response) (bool, error) { return true, err }
