package mysqlstore

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// TestByteExactKeys: MySQL's and MariaDB's default collations are
// case-insensitive and PAD SPACE, so "k", "K" and "k " would be one record
// (one client replaying another's response). The store compares bytes:
// three keys, three records, each completed on its own; the same for scopes.
func TestByteExactKeys(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	variants := []string{"k", "K", "k ", "k\x00", "ｋ"} // fullwidth k: equal to k under some Unicode collations
	for _, field := range []string{"key", "scope"} {
		tokens := map[int64]bool{}
		fences := map[string]storekit.Fence{}
		for _, v := range variants {
			req := claimReq("same-key", time.Minute)
			if field == "key" {
				req.Key = v
			} else {
				req.Scope = v
			}
			res, err := s.Claim(ctx, req)
			if err != nil {
				t.Fatalf("%s %q: %v", field, v, err)
			}
			if !res.Claimed {
				t.Fatalf("%s %q: not claimed: merged with an existing record (token %d)", field, v, res.Record.Token)
			}
			tokens[res.Record.Token] = true
			fences[v] = storekit.Fence{Scope: req.Scope, Key: req.Key, Token: res.Record.Token}
		}
		if len(tokens) != len(variants) {
			t.Errorf("%s: %d distinct tokens for %d variants", field, len(tokens), len(variants))
		}
		// Complete each with its own status; each reads back its own.
		for i, v := range variants {
			if err := s.Complete(ctx, fences[v], storekit.StoredResponse{Status: 200 + i}); err != nil {
				t.Fatalf("%s %q: complete: %v", field, v, err)
			}
		}
		for i, v := range variants {
			f := fences[v]
			r, err := s.Get(ctx, f.Scope, f.Key)
			if err != nil {
				t.Fatalf("%s %q: get: %v", field, v, err)
			}
			if r.Scope != f.Scope || r.Key != f.Key || r.Token != f.Token || r.Response == nil || r.Response.Status != 200+i {
				t.Errorf("%s %q: got token %d status %v, want token %d status %d", field, v, r.Token, r.Response, f.Token, 200+i)
			}
		}
		// And a key differing only by trailing space is not found.
		if field == "key" {
			if _, err := s.Get(ctx, "tenant", "k  "); !errors.Is(err, storekit.ErrNotFound) {
				t.Errorf(`Get "k  " (two spaces): %v, want ErrNotFound`, err)
			}
		}
	}
}
