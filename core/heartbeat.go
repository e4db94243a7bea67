package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// startHeartbeat renews the lease every lease/3 until finish. since is
// when the claim was sent: the store's lease runs from no earlier than that,
// and likewise from each renewal's sending, not from its reply. If no renewal
// succeeded for a whole lease, another instance may own the key: the handler
// is stopped then, at the latest, even while a renewal is still pending.
func (d *Decision) startHeartbeat(since time.Time) {
	o := d.own
	o.d = d
	o.hbSince = since
	o.hbLoop.Add(1)
	d.eng.hb.add(o, d.eng.cfg.lease/3)
}

// hbQueue holds the claims whose first renewal is not due yet, in the
// order it falls due (every claim waits the same lease/3), under one timer
// per engine. Most handlers finish well within lease/3: a short request
// then costs a list insertion and removal, not a runtime timer of its own;
// the renewal loop (a goroutine, a ticker, a timer and its stop channel)
// starts only when the first renewal is due.
type hbQueue struct {
	mu         sync.Mutex
	head, tail *owner
	timer      *time.Timer // fires at head's due time while armed
	armed      bool
}

func (q *hbQueue) add(o *owner, wait time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o.due = time.Now().Add(wait) // under the lock: the list stays in due order
	o.queued = true
	o.prev, o.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = o
	} else {
		q.head = o
	}
	q.tail = o
	if q.armed {
		return // armed for an earlier due time
	}
	q.armed = true
	if q.timer == nil {
		q.timer = time.AfterFunc(wait, q.fire)
	} else {
		q.timer.Reset(wait)
	}
}

// remove takes o off the queue and reports whether it was there, that is
// whether its renewal loop has not been started.
func (q *hbQueue) remove(o *owner) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !o.queued {
		return false
	}
	q.unlinkLocked(o)
	return true
}

func (q *hbQueue) unlinkLocked(o *owner) {
	if o.prev != nil {
		o.prev.next = o.next
	} else {
		q.head = o.next
	}
	if o.next != nil {
		o.next.prev = o.prev
	} else {
		q.tail = o.prev
	}
	o.prev, o.next, o.queued = nil, nil, false
}

// fire starts the renewal loop of every claim that is due and re-arms the
// timer for the next one.
func (q *hbQueue) fire() {
	q.mu.Lock()
	now := time.Now()
	var due []*owner
	for q.head != nil && !q.head.due.After(now) {
		o := q.head
		q.unlinkLocked(o)
		due = append(due, o)
	}
	if q.head != nil {
		q.timer.Reset(q.head.due.Sub(now))
	} else {
		q.armed = false
	}
	q.mu.Unlock()
	for _, o := range due {
		go o.d.heartbeatLoop()
	}
}

// heartbeatLoop runs on its own goroutine, from when the first renewal is
// due until finish.
func (d *Decision) heartbeatLoop() {
	o := d.own
	defer o.hbLoop.Done()
	o.mu.Lock()
	if o.finished { // finish came first (hbQueue.remove lost the race): nothing to do
		o.mu.Unlock()
		return
	}
	o.hbStop = make(chan struct{})
	stop := o.hbStop
	o.mu.Unlock()
	e := d.eng
	lease := e.cfg.lease
	interval := lease / 3
	t := time.NewTicker(interval)
	defer t.Stop()
	lastOK := o.hbSince
	expiry := time.NewTimer(lease - e.cfg.now().Sub(lastOK))
	defer expiry.Stop()
	for due := true; ; due = false { // the first renewal is due as the loop starts
		if !due {
			select {
			case <-stop:
				return
			case <-expiry.C:
				if left := lease - e.cfg.now().Sub(lastOK); left > 0 {
					expiry.Reset(left)
					continue
				}
				d.loseLease(fmt.Errorf("idem: heartbeat: no renewal succeeded for a whole lease (%v): %w", lease, ErrLeaseLost))
				return
			case <-t.C:
			}
		}
		sent := e.cfg.now()
		// A renewal still pending when the lease runs out is too late.
		timeout := min(interval, lease-sent.Sub(lastOK))
		ctx, cancel := context.WithTimeout(contextWithLease(context.Background(), d.lease), timeout)
		o.mu.Lock()
		if o.finished { // Commit or Abort began: no more renewals
			o.mu.Unlock()
			cancel()
			return
		}
		o.hbCancel = cancel
		o.mu.Unlock()
		err := e.store.Heartbeat(ctx, d.lease.fence, lease)
		o.mu.Lock()
		o.hbCancel = nil
		stopped := o.finished
		o.mu.Unlock()
		cancel()
		if stopped {
			return
		}
		if err == nil {
			lastOK = sent
			expiry.Reset(lease - e.cfg.now().Sub(lastOK))
			continue
		}
		err = e.scrub(err, d.Key)
		e.observe(Event{Kind: EventHeartbeatError, Scope: d.Scope, Route: d.route, Err: err})
		e.log(context.Background(), slog.LevelWarn, "heartbeat_error", d.Key, d.Scope, d.route, slog.Any("err", err))
		switch {
		case errors.Is(err, ErrLeaseLost):
			d.loseLease(fmt.Errorf("idem: heartbeat: %w", err))
			return
		case e.cfg.now().Sub(lastOK) >= lease:
			// A whole lease without a successful heartbeat: another
			// instance may own the key now. Stop the handler.
			d.loseLease(fmt.Errorf("idem: heartbeat failed for a whole lease (%v): %w", err, ErrLeaseLost))
			return
		}
	}
}

func (d *Decision) loseLease(cause error) {
	o := d.own
	o.mu.Lock()
	o.lostErr = cause
	cancels := o.cancels
	o.cancels = nil
	o.mu.Unlock()
	for _, c := range cancels {
		c(cause)
	}
}
