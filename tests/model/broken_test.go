package model

import (
	"context"
	"testing"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/storekit"
)

// The checker is not vacuous: each of these stores breaks one rule of the
// protocol, and the bounded run must reject at least one of its histories.

// liveTakeover lets a second claim succeed while the first owner's lease
// is live (a missing "locked_until <= now" in a takeover condition).
type liveTakeover struct{ *memstore.Store }

func (s liveTakeover) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err != nil || res.Claimed || res.Record.Status != storekit.StatusProcessing || res.Record.Fingerprint != req.Fingerprint {
		return res, err
	}
	if err := s.Store.Fail(ctx, storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}); err != nil {
		return res, nil
	}
	return s.Store.Claim(ctx, req)
}

// unfencedComplete completes whatever processing record holds the key,
// whatever token the caller has (a complete that forgot "AND token = $3").
type unfencedComplete struct{ *memstore.Store }

func (s unfencedComplete) Complete(ctx context.Context, f storekit.Fence, resp storekit.StoredResponse) error {
	if r, err := s.Store.Get(ctx, f.Scope, f.Key); err == nil && r.Status == storekit.StatusProcessing {
		f.Token = r.Token
	}
	return s.Store.Complete(ctx, f, resp)
}

// forgetfulSteps loses the steps at a takeover (steps keyed by token
// instead of by record incarnation).
type forgetfulSteps struct{ *memstore.Store }

func (s forgetfulSteps) LoadSteps(ctx context.Context, f storekit.Fence) (map[string][]byte, error) {
	if _, err := s.Store.LoadSteps(ctx, f); err != nil {
		return nil, err
	}
	return map[string][]byte{}, nil
}

// replayOther answers a replay with a response that is not the one stored
// (a record read by the wrong key, a response cache gone stale).
type replayOther struct{ *memstore.Store }

func (s replayOther) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && res.Record.Response != nil && res.Record.Token%2 == 0 {
		resp := *res.Record.Response
		resp.Body = append([]byte("x"), resp.Body...)
		resp.Header = resp.Header.Clone()
		resp.Header.Set("X-Resp", string(resp.Body))
		res.Record.Response = &resp
	}
	return res, err
}

// reusedToken draws the token of a key anew for each new record, so a key
// new again after expiry hands out a token already used.
type reusedToken struct{ *memstore.Store }

func (s reusedToken) Claim(ctx context.Context, req storekit.ClaimRequest) (storekit.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, req)
	if err == nil && res.Claimed && res.Fresh {
		res.Record.Token = 1
	}
	return res, err
}

func TestCheckerCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wrap func(*memstore.Store) core.Store
	}{
		{"live-takeover", func(s *memstore.Store) core.Store { return liveTakeover{s} }},
		{"unfenced-complete", func(s *memstore.Store) core.Store { return unfencedComplete{s} }},
		{"forgetful-steps", func(s *memstore.Store) core.Store { return forgetfulSteps{s} }},
		{"replay-other", func(s *memstore.Store) core.Store { return replayOther{s} }},
		{"reused-token", func(s *memstore.Store) core.Store { return reusedToken{s} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// A fixed bound, whatever IDEM_MODEL_ITER says: each is caught
			// in most histories (see the log), so 200 never all pass.
			cfg := config(t, 0)
			cfg.Histories, cfg.StopAtFirst = 200, true
			sum, fails := Run(context.Background(), cfg, func(int) *Env { return memEnv(tc.wrap) })
			if len(fails) == 0 {
				t.Fatalf("the checker accepted all %d histories of a broken store: %s", sum.Histories, sum.String())
			}
			t.Logf("%s: caught at history %d: %s", tc.name, fails[0].History, Describe(fails[0].Ops[0].In, fails[0].Ops[0].Out))
		})
	}
}
