package core

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/internal/redact"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/core/internal/rerun"

	"github.com/idemkit/idem/core/adapterkit"
)

// Engine decides, for every request, whether the handler runs. It is safe
// for concurrent use; build one per store and share it across adapters.
type Engine struct {
	store Store
	cfg   config
	hb    hbQueue
	// keep: the routes whose requests are kept for a completer (set by
	// core/completer through rerun.Keep; nil: none).
	keep atomic.Pointer[rerun.Routes]
}

func init() {
	rerun.Keep = func(e any, routes rerun.Routes) { e.(*Engine).keep.Store(&routes) }
	rerun.Observe = func(e any, kind, scope, route string) {
		e.(*Engine).observe(Event{Kind: kind, Scope: scope, Route: route})
	}
	rerun.Warn = func(e any, msg string, err error) {
		e.(*Engine).cfg.logger.Warn(msg, slog.Any("err", err))
	}
}

// New builds an engine on store. It validates the options and returns an
// error describing every invalid one; it never panics.
func New(store Store, opts ...Option) (*Engine, error) {
	if store == nil {
		return nil, errors.New("idem: store is nil")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.stepsRequired && stepStoreOf(store) == nil {
		return nil, fmt.Errorf("idem: WithStepsRequired: store %T does not keep steps (storekit.StepStore)", store)
	}
	cfg.header = http.CanonicalHeaderKey(cfg.header)
	cfg.replayed = http.CanonicalHeaderKey(cfg.replayed)
	// Canonicalise a copy: the default list is a shared package variable.
	canon := make([]string, len(cfg.replayHeaders))
	for i, h := range cfg.replayHeaders {
		canon[i] = http.CanonicalHeaderKey(h)
	}
	cfg.replayHeaders = canon
	return &Engine{store: store, cfg: cfg}, nil
}

// CheckScope is called by adapter constructors: it returns an error naming
// option (the adapter's scope option, e.g. "nethttpidem.WithScope") unless
// records will be keyed per tenant (adapterScope: that option was given
// with a function; or the engine has WithScope) or the engine explicitly
// shares one key space (WithSharedKeySpace).
func (e *Engine) CheckScope(option string, adapterScope bool) error {
	if adapterScope || !e.cfg.defaultScope || e.cfg.sharedKeySpace {
		return nil
	}
	return fmt.Errorf("idem: no scope function: without one every client shares one key space, and client B "+
		"sending client A's key gets A's stored response; set %s (or core.WithScope on the engine), "+
		"or opt into a shared key space with core.WithSharedKeySpace()", option)
}

// Store returns the engine's store.
func (e *Engine) Store() Store { return e.store }

// keptHeaders returns the allow-listed headers of resp: from Header or,
// when it is nil, from HeaderReader.
func (e *Engine) keptHeaders(resp *adapterkit.Response) http.Header {
	if resp.Header != nil || resp.HeaderReader == nil {
		return e.filterHeaders(resp.Header)
	}
	var out http.Header
	for _, name := range e.cfg.replayHeaders {
		if v := resp.HeaderReader.Values(name); len(v) > 0 {
			if out == nil {
				out = make(http.Header, 2)
			}
			out[name] = v[:len(v):len(v)] // capped: an append elsewhere reallocates
		}
	}
	if out == nil {
		out = http.Header{}
	}
	return out
}

// filterHeaders keeps the allow-listed headers of h, under their canonical
// names. Keys a handler put in the map directly (h["content-type"]) reach
// the client as written, so they count too; canonical keys come first.
func (e *Engine) filterHeaders(h http.Header) http.Header {
	n := 0
	for _, name := range e.cfg.replayHeaders {
		n += len(h[name])
	}
	// One backing array for the values kept under canonical names; each
	// key's slice is capped, so appending the odd keys below reallocates.
	vals := make([]string, 0, n)
	out := make(http.Header, min(len(h), len(e.cfg.replayHeaders)))
	for _, name := range e.cfg.replayHeaders {
		if v, ok := h[name]; ok && len(v) > 0 {
			i := len(vals)
			vals = append(vals, v...)
			out[name] = vals[i:len(vals):len(vals)]
		}
	}
	var odd []string
	for k := range h {
		if len(h[k]) > 0 && http.CanonicalHeaderKey(k) != k {
			odd = append(odd, k)
		}
	}
	sort.Strings(odd)
	for _, k := range odd {
		name := http.CanonicalHeaderKey(k)
		if slices.Contains(e.cfg.replayHeaders, name) {
			out[name] = append(out[name], h[k]...)
		}
	}
	return out
}

// timing starts timing a store call for the observer's Event.Duration: the
// clock is read only when there is an observer (a clock read is a visible
// share of a replay's CPU on some VMs).
func (e *Engine) timing() time.Time {
	if e.cfg.observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// since is time.Since(start) for a start from timing, 0 without one.
func since(start time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	return time.Since(start)
}

// took is the observer's duration of a commit that started at start.
func (e *Engine) took(start time.Time) time.Duration {
	if e.cfg.observer == nil {
		return 0
	}
	return time.Since(start)
}

func (e *Engine) observe(ev Event) {
	if e.cfg.observer != nil {
		e.cfg.observer(ev)
	}
}

func (e *Engine) log(ctx context.Context, level slog.Level, msg, key, scope, route string, attrs ...slog.Attr) {
	if !e.cfg.logger.Enabled(ctx, level) {
		return
	}
	base := make([]slog.Attr, 0, 4+len(attrs))
	if key != "" {
		base = append(base, slog.String("key", e.redact(key)))
	}
	if scope != "" {
		base = append(base, slog.String("scope", scope))
	}
	if route != "" {
		base = append(base, slog.String("route", route))
	}
	base = append(base, attrs...)
	e.cfg.logger.LogAttrs(ctx, level, "idem: "+msg, base...)
}

// redact hides a key behind a short hash: enough to correlate log lines,
// useless to replay the request.
func (e *Engine) redact(key string) string {
	return RedactKey(key)
}

// scrub returns err with the key scrubbed from its message (redact.Error),
// so that a store error, a scope function's error, a handler's error or
// panic quoting the key cannot carry it into a log line, an event or an
// error handler. errors.Is and errors.As still see the original chain.
func (e *Engine) scrub(err error, key string) error {
	return redact.Error(err, key)
}
