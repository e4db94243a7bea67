package core

import (
	"time"

	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/storekit"
)

// Internals the external tests (package core_test) check directly.

// ErrNotOwner is what Commit and Abort answer for a decision that does not
// own its key.
var ErrNotOwner = errNotOwner

// WithClock sets the engine's clock, used only for local timing (wait
// deadlines, heartbeat loss): for tests that drive time. Record times
// always come from the store.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now = now })
}

func ProblemResponse(name string, status int, detail string) *adapterkit.Response {
	return problemResponse(name, status, detail)
}

func (e *Engine) Problem(name, detail string) *adapterkit.Response { return e.problem(name, detail) }

func (e *Engine) PanicResponse() *adapterkit.Response { return e.panicResponse() }

func (e *Engine) CommitErrorResponse(err error) *adapterkit.Response {
	return e.commitErrorResponse(err)
}

// StepsSupported reports whether the engine finds a StepStore in s.
func StepsSupported(s Store) bool { return stepStoreOf(s) != nil }

// Key syntax, unexported because only core's tests need it (core/openapi
// checks its published pattern against the engine).
var ParseKey = parseKey

// The fingerprint, pinned by the golden tests.
var Fingerprint = fingerprint

type FingerprintInput = fingerprintInput

// Fence returns the fence of a Proceed decision (zero otherwise): stores
// find it in the handler's context (storekit.LeaseFromContext).
func (d *Decision) Fence() storekit.Fence {
	if d == nil || d.lease == nil {
		return storekit.Fence{}
	}
	return d.lease.fence
}
