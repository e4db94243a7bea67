package completer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/internal/rerun"
	"github.com/idemkit/idem/core/storekit"
)

// Completer finishes stalled executions of one engine. It is safe for
// concurrent use.
type Completer struct {
	e      *core.Engine
	cfg    config
	stuck  stuckLister
	steps  storekit.StepStore
	routes map[string]route
	// forward, when set, sends every kept HTTP request no route names
	// (Forward).
	forward *route
}

// stuckLister is the part of storekit.Admin a completer needs (memstore
// has only this part).
type stuckLister interface {
	Stuck(ctx context.Context, limit int) ([]storekit.AdminRecord, error)
}

// route is how one registered route is sent again.
type route struct {
	headers []string
	// run sends req again; ran reports that the handler ran (not a
	// replay: another instance finished the record first) where the
	// engine cannot say so itself (Forward: the re-run crosses the
	// network; in process the engine sets the mark's Took).
	run func(ctx context.Context, rec storekit.AdminRecord, req rerun.Request) (ran bool, err error)
}

// Report is what one pass did.
type Report struct {
	// Finished counts the records a re-run completed.
	Finished int
	// Failed counts re-runs that did not complete their record (the
	// handler failed retryably, the store failed): the record is looked at
	// again next pass. A record another instance finished or is finishing
	// counts nowhere.
	Failed int
	// Abandoned counts records left to operators, past WithMaxAge.
	Abandoned int
}

// New returns a completer for e's routes given as options (HTTP, Call) and
// makes e keep their requests from now on. It fails when e's store cannot
// list stalled records or keep steps (storekit.Admin, storekit.StepStore)
// or no route is given.
func New(e *core.Engine, opts ...Option) (*Completer, error) {
	if e == nil {
		return nil, errors.New("completer: nil engine")
	}
	c := &Completer{e: e, cfg: defaults(), routes: map[string]route{}}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	var ok bool
	if c.stuck, ok = storekit.As[stuckLister](e.Store()); !ok {
		return nil, fmt.Errorf("completer: store %T cannot list stalled records (storekit.Admin's Stuck)", e.Store())
	}
	if c.steps, ok = storekit.As[storekit.StepStore](e.Store()); !ok {
		return nil, fmt.Errorf("completer: store %T does not keep steps (storekit.StepStore)", e.Store())
	}
	n := len(c.routes)
	if c.forward != nil {
		n++
	}
	if err := c.cfg.validate(n, e.Policy().Retention); err != nil {
		return nil, err
	}
	keep := make(rerun.Routes, len(c.routes))
	for k, r := range c.routes {
		keep[k] = r.headers
	}
	rerun.Keep(e, keep)
	return c, nil
}

// Run makes a pass every WithInterval until ctx ends, and returns nil then.
// A pass that fails is logged with the engine's logger and tried again at
// the next tick.
func (c *Completer) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.interval)
	defer t.Stop()
	for {
		if _, err := c.Once(ctx); err != nil && ctx.Err() == nil {
			rerun.Warn(c.e, "completer: pass failed", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Once makes one pass: it lists up to WithLimit stalled records and
// re-runs those it can finish. An error means the listing failed; a
// record's own failure is counted in the report and logged by the engine.
func (c *Completer) Once(ctx context.Context) (Report, error) {
	var rep Report
	stuck, err := c.stuck.Stuck(ctx, c.cfg.limit)
	if err != nil {
		return rep, fmt.Errorf("completer: list stalled records: %w", err)
	}
	for _, rec := range stuck {
		if ctx.Err() != nil {
			break
		}
		r, ok := c.routes[rerun.Route(rec.Method, rec.Route)]
		if !ok && c.forward != nil && rec.Method != storekit.CallMethod {
			r, ok = *c.forward, true
		}
		if !ok || !rec.Stuck() || rec.Now.Sub(rec.LockedUntil) < c.cfg.after {
			continue
		}
		if rec.Now.Sub(rec.CreatedAt) > c.cfg.maxAge {
			rerun.Observe(c.e, core.EventAbandoned, rec.Scope, rec.Route)
			rep.Abandoned++
			continue
		}
		req, ok := c.keptRequest(ctx, rec)
		if !ok {
			continue
		}
		var took atomic.Bool
		mctx := rerun.With(ctx, rerun.Mark{Scope: rec.Scope, Born: rec.CreatedAt, Took: &took})
		ran, err := r.run(mctx, rec, req)
		ran = ran || took.Load()
		switch {
		case err != nil:
			rep.Failed++
		case !ran: // another instance finished it first
		case c.completed(ctx, rec):
			rep.Finished++
		default:
			rep.Failed++ // the handler's answer was retryable: the key was released
		}
	}
	return rep, nil
}

// completed reports whether rec's incarnation is completed now.
func (c *Completer) completed(ctx context.Context, rec storekit.AdminRecord) bool {
	got, err := c.e.Store().Get(ctx, rec.Scope, rec.Key)
	return err == nil && got.Status == storekit.StatusCompleted && got.CreatedAt.Equal(rec.CreatedAt)
}

// keptRequest returns the request kept with rec's steps. It is false when
// rec has none (no step stored: nothing happened that needs finishing) or
// is no longer the record listed.
func (c *Completer) keptRequest(ctx context.Context, rec storekit.AdminRecord) (rerun.Request, bool) {
	steps, err := c.steps.LoadSteps(ctx, storekit.Fence{Scope: rec.Scope, Key: rec.Key, Token: rec.Token})
	if err != nil {
		return rerun.Request{}, false
	}
	for name, v := range steps {
		if !strings.HasPrefix(name, rerun.Prefix) {
			continue
		}
		if b, _, ok := rerun.Unwrap(v); ok {
			req, err := rerun.Decode(b)
			return req, err == nil
		}
	}
	return rerun.Request{}, false
}

// HTTP registers a route served over HTTP: method and path as the record
// names them (the route template in the framework's spelling, e.g.
// "/v1/payments/:id", or the path where the adapter knows no template), h
// the application's handler with the idem middleware on the route (a
// router, or a compensating handler). headers names request headers the
// handler reads besides the body (e.g. "X-User-ID"); the kept request
// carries them. Do not list credentials that expire or must not be stored.
func HTTP(method, path string, h http.Handler, headers ...string) Option {
	return optionFunc(func(c *Completer) {
		if h == nil {
			c.cfg.errs = append(c.cfg.errs, fmt.Errorf("completer.HTTP %s %s: nil handler", method, path))
			return
		}
		c.routes[rerun.Route(strings.ToUpper(method), adapterkit.CanonicalRoute(path))] = route{
			headers: headers,
			run: func(ctx context.Context, rec storekit.AdminRecord, req rerun.Request) (bool, error) {
				_, err := c.serve(ctx, h, rec, req)
				return false, err // in process, the mark says whether it ran
			}}
	})
}

// Forward sends every kept HTTP request that no HTTP option names to h,
// for a tool outside the service that forwards it there (idemctl complete):
// a kept request is one an instance of the service kept, so the service
// registered its route. The record's scope does not cross the network: the
// service finds it from the kept headers, as for the client's own retry,
// and the re-run is that retry.
func Forward(h http.Handler) Option {
	return optionFunc(func(c *Completer) {
		if h == nil {
			c.cfg.errs = append(c.cfg.errs, errors.New("completer.Forward: nil handler"))
			return
		}
		c.forward = &route{run: func(ctx context.Context, rec storekit.AdminRecord, req rerun.Request) (bool, error) {
			return c.serve(ctx, h, rec, req)
		}}
	})
}

// Call registers an operation of core.Engine.Call by its name, with the
// function the call runs: it gets the kept input.
func Call(name string, fn func(ctx context.Context, input []byte) ([]byte, error)) Option {
	return optionFunc(func(c *Completer) {
		if fn == nil {
			c.cfg.errs = append(c.cfg.errs, fmt.Errorf("completer.Call %s: nil function", name))
			return
		}
		c.routes[rerun.Route(storekit.CallMethod, name)] = route{
			run: func(ctx context.Context, rec storekit.AdminRecord, req rerun.Request) (bool, error) {
				_, err := c.e.Call(ctx, core.CallRequest{Scope: rec.Scope, Key: rec.Key, Name: rec.Route, Input: req.Body},
					func(ctx context.Context) ([]byte, error) { return fn(ctx, req.Body) })
				if errors.Is(err, core.ErrInFlight) {
					return false, nil // being finished by another instance
				}
				return false, err // the mark says whether it ran
			}}
	})
}

// serve sends req again through h, with rec's key.
func (c *Completer) serve(ctx context.Context, h http.Handler, rec storekit.AdminRecord, req rerun.Request) (bool, error) {
	r, err := http.NewRequestWithContext(ctx, req.Method, req.Target, bytes.NewReader(req.Body))
	if err != nil {
		return false, fmt.Errorf("completer: rebuild request: %w", err)
	}
	r.RequestURI = req.Target
	r.Header = req.Header.Clone()
	if r.Header == nil {
		r.Header = http.Header{}
	}
	p := c.e.Policy()
	r.Header.Set(p.Header, rec.Key)
	w := &discard{header: http.Header{}}
	h.ServeHTTP(w, r)
	if w.header.Get(p.ReplayedHeader) == "true" || w.status == http.StatusConflict {
		return false, nil // finished or being finished by another instance
	}
	if w.status >= 500 {
		return false, fmt.Errorf("completer: re-run answered %d", w.status)
	}
	return true, nil
}

// discard is the ResponseWriter of a re-run: the response is stored by the
// engine; nobody reads this copy.
type discard struct {
	header http.Header
	status int
}

func (d *discard) Header() http.Header { return d.header }
func (d *discard) WriteHeader(code int) {
	if d.status == 0 {
		d.status = code
	}
}
func (d *discard) Write(b []byte) (int, error) {
	d.WriteHeader(http.StatusOK)
	return len(b), nil
}

// SplitStep reads a step as a store keeps it (storekit.StepStore's
// LoadSteps): the step's name and result, and whether the request a
// completer re-sends rides with it. For tools that show steps (idemctl
// inspect).
func SplitStep(name string, stored []byte) (step string, result []byte, request bool) {
	if n, ok := strings.CutPrefix(name, rerun.Prefix); ok {
		if _, res, ok := rerun.Unwrap(stored); ok {
			return n, res, true
		}
	}
	return name, stored, false
}
