package core

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxTestKey struct{}

// TestCommitCtx pins that the commit context behaves as
// context.WithTimeout(context.WithoutCancel(ctx)) plus the lease: values
// kept, parent cancellation hidden, deadline enforced with or without a
// Done watcher, and derived contexts (context.AfterFunc, WithCancel) ended
// with it.
func TestCommitCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancelParent := context.WithCancelCause(context.WithValue(context.Background(), ctxTestKey{}, "v"))
		cancelParent(errors.New("client gone"))
		l := &grant{}
		newCtx := func(d time.Duration) *commitCtx {
			return &commitCtx{values: context.WithoutCancel(parent), lease: l, deadline: time.Now().Add(d)}
		}

		c := newCtx(time.Hour)
		if c.Err() != nil {
			t.Errorf("Err = %v; the parent's cancellation must not show", c.Err())
		}
		if got := c.Value(ctxTestKey{}); got != "v" {
			t.Errorf("Value = %v, want the parent's", got)
		}
		if got, _ := leaseFrom(c); got != l {
			t.Error("lease not carried")
		}
		if context.Cause(c) != nil {
			t.Errorf("Cause = %v; the parent's cause must not show", context.Cause(c))
		}
		if _, ok := c.Deadline(); !ok {
			t.Error("no deadline")
		}
		child, cancelChild := context.WithCancel(c)
		defer cancelChild()
		ran := make(chan struct{})
		context.AfterFunc(c, func() { close(ran) })
		stopped := context.AfterFunc(c, func() { t.Error("stopped AfterFunc ran") })
		if !stopped() {
			t.Error("stop of a pending AfterFunc returned false")
		}
		c.cancel(context.Canceled)
		<-ran
		<-child.Done()
		<-c.Done()
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
			t.Errorf("after cancel: Err = %v, child %v", c.Err(), child.Err())
		}
		c.cancel(context.DeadlineExceeded) // later calls change nothing
		if !errors.Is(c.Err(), context.Canceled) {
			t.Errorf("second cancel changed Err to %v", c.Err())
		}

		// Deadline without anyone watching: Err reads the clock.
		c = newCtx(time.Millisecond)
		time.Sleep(5 * time.Millisecond)
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Errorf("past the deadline: Err = %v", c.Err())
		}
		<-c.Done()

		// Deadline with a watcher: the timer closes Done.
		c = newCtx(10 * time.Millisecond)
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Done not closed at the deadline")
		}
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Errorf("at the deadline: Err = %v", c.Err())
		}
		late := make(chan struct{})
		context.AfterFunc(c, func() { close(late) }) // registered after the end: runs at once
		<-late
		c.cancel(context.Canceled)
	})
}
