package storetest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/storekit"
)

// ErrKilled is what a Dying store's owner writes return after Kill.
var ErrKilled = errors.New("storetest: process killed")

// Dying is a store as a process that can be SIGKILLed sees it, for tests of
// what survives an owner's death (takeovers, core/completer): after Kill,
// the owner's writes to its record (Heartbeat, Complete, Fail) fail with
// ErrKilled and change nothing, as the writes of a dead process never
// arrive. The steps it stored before stay: they reach the store behind it
// (Unwrap), as does every other capability.
type Dying struct {
	core.Store
	dead atomic.Bool
}

// NewDying wraps s.
func NewDying(s core.Store) *Dying { return &Dying{Store: s} }

// Kill kills the process: its later writes are lost.
func (d *Dying) Kill() { d.dead.Store(true) }

// Unwrap returns the store behind d (storekit.As follows it).
func (d *Dying) Unwrap() core.Store { return d.Store }

// Heartbeat implements core.Store.
func (d *Dying) Heartbeat(ctx context.Context, f storekit.Fence, extend time.Duration) error {
	if d.dead.Load() {
		return ErrKilled
	}
	return d.Store.Heartbeat(ctx, f, extend)
}

// Complete implements core.Store.
func (d *Dying) Complete(ctx context.Context, f storekit.Fence, r storekit.StoredResponse) error {
	if d.dead.Load() {
		return ErrKilled
	}
	return d.Store.Complete(ctx, f, r)
}

// Fail implements core.Store.
func (d *Dying) Fail(ctx context.Context, f storekit.Fence) error {
	if d.dead.Load() {
		return ErrKilled
	}
	return d.Store.Fail(ctx, f)
}
