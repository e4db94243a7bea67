// Package claimrule holds the claim rule of core.Store written once in Go,
// for the SQL stores that re-check their statement's answer: a claim of req
// at now may create or take over r when r is past retention (and not held
// by a live lease), or when it is the same request (method, route,
// fingerprint) and failed or processing under a lapsed lease.
package claimrule

import (
	"time"

	"github.com/idemkit/idem/core"
)

// Claimable reports whether a claim of req at now may create or take over r
// (the condition the stores' claim statements test).
func Claimable(r *core.Record, now time.Time, req *core.ClaimRequest) bool {
	live := r.Status == core.StatusProcessing && r.LockedUntil.After(now)
	if !r.ExpiresAt.After(now) && !live {
		return true
	}
	return r.Method == req.Method && r.Route == req.Route && r.Fingerprint == req.Fingerprint &&
		(r.Status == core.StatusFailed || (r.Status == core.StatusProcessing && !live))
}
