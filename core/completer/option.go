package completer

import (
	"errors"
	"fmt"
	"time"
)

// Option configures a Completer, in the OpenTelemetry-contrib style.
type Option interface{ apply(*Completer) }

type optionFunc func(*Completer)

func (f optionFunc) apply(c *Completer) { f(c) }

type config struct {
	interval, after, maxAge time.Duration
	limit                   int
	errs                    []error
}

func defaults() config {
	return config{interval: 30 * time.Second, after: time.Minute, limit: 100}
}

// validate checks c against the engine's retention, and sets the default
// maximum age.
func (c *config) validate(routes int, retention time.Duration) error {
	errs := c.errs
	if c.maxAge == 0 {
		c.maxAge = min(time.Hour, retention/2)
	} else if c.maxAge >= retention {
		errs = append(errs, fmt.Errorf("completer: WithMaxAge %v: must be under the engine's retention %v", c.maxAge, retention))
	}
	if routes == 0 {
		errs = append(errs, errors.New("completer: no route given (HTTP, Call, Forward)"))
	}
	if c.interval <= 0 {
		errs = append(errs, fmt.Errorf("completer: WithInterval %v: must be positive", c.interval))
	}
	if c.after < 0 || c.maxAge <= c.after {
		errs = append(errs, fmt.Errorf("completer: WithAfter %v, WithMaxAge %v: want 0 <= after < max age", c.after, c.maxAge))
	}
	if c.limit <= 0 {
		errs = append(errs, fmt.Errorf("completer: WithLimit %d: must be positive", c.limit))
	}
	return errors.Join(errs...)
}

// WithInterval sets how often Run makes a pass. Default: 30s.
func WithInterval(d time.Duration) Option {
	return optionFunc(func(c *Completer) { c.cfg.interval = d })
}

// WithAfter sets how long past its lapsed lease a record must be before a
// completer takes it: the time a client's own retry has to come first.
// Default: 1m. 0 takes a record as soon as its lease lapses.
func WithAfter(d time.Duration) Option {
	return optionFunc(func(c *Completer) { c.cfg.after = d })
}

// WithMaxAge sets the age (since the record's creation) past which a
// completer gives a stalled record up to operators (core.EventAbandoned;
// idemctl stuck lists it). It must be under the engine's retention (a
// record past it is new again). Default: 1h, or half the retention when
// that is shorter.
func WithMaxAge(d time.Duration) Option {
	return optionFunc(func(c *Completer) { c.cfg.maxAge = d })
}

// WithLimit sets how many stalled records a pass looks at, the longest
// stalled first. Default: 100.
func WithLimit(n int) Option {
	return optionFunc(func(c *Completer) { c.cfg.limit = n })
}
