package model

import (
	"testing"
	"time"
)

// config is the run size of the tests: IDEM_MODEL_ITER histories (def by
// default) of 4 clients × 30 calls on 2 keys.
func config(t *testing.T, def int) Config {
	t.Helper()
	if def > 0 {
		def = Iterations(t, def)
	}
	cfg := Config{
		Histories:    def,
		Clients:      4,
		OpsPerClient: 30,
		Keys:         2,
		Seed:         Seed(t),
		CheckTimeout: 2 * time.Minute,
	}
	t.Logf("seed %d (IDEM_MODEL_SEED), %d histories (IDEM_MODEL_ITER)", cfg.Seed, cfg.Histories)
	return cfg
}

// covered fails t unless the run checked what it is meant to check: every
// history decided and linearizable, fresh claims, takeovers, replays, stale
// writes refused, steps resumed, no token handed out twice, and (kills)
// calls whose outcome was unknown.
func covered(t *testing.T, sum Summary, kills bool) {
	t.Helper()
	t.Log(sum.String())
	if sum.Histories < 20 {
		t.Logf("only %d histories (IDEM_MODEL_ITER): coverage not required", sum.Histories)
	}
	if sum.Undecided > 0 {
		t.Errorf("%d of %d histories were not decided within the check timeout", sum.Undecided, sum.Histories)
	}
	if sum.DuplicateTokens > 0 {
		t.Errorf("%d claims answered a token already handed out", sum.DuplicateTokens)
	}
	checks := []struct {
		what string
		n    int
	}{
		{"fresh claims", sum.Fresh},
		{"takeovers", sum.Takeovers},
		{"replays", sum.Replays},
		{"completes", sum.Count(Complete, OK)},
		{"stale completes refused", sum.Count(Complete, LeaseLost)},
		{"stale heartbeats refused", sum.Count(Heartbeat, LeaseLost)},
		{"steps saved", sum.Count(SaveStep, OK)},
		{"steps resumed", sum.StepsResumed},
	}
	if kills {
		checks = append(checks, struct {
			what string
			n    int
		}{"connection kills", sum.Kills})
		unknown := 0
		for _, m := range sum.Calls {
			unknown += m[Unknown]
		}
		checks = append(checks, struct {
			what string
			n    int
		}{"calls with an unknown outcome", unknown})
	}
	for _, c := range checks {
		if c.n == 0 && sum.Histories >= 20 {
			t.Errorf("the run exercised no %s: it proves nothing about them", c.what)
		}
	}
}
