package sqlkit

import (
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// Claimable reports whether a claim of req at now may create or take over
// r, the condition the stores' claim statements test (core.Store.Claim):
// r is past retention and not held by a live lease, or it is the same
// request (method, route, fingerprint) and failed, or processing under a
// lapsed lease. Stores that re-check their statement's answer in Go call
// it, so the rule is written once.
func Claimable(r *storekit.Record, now time.Time, req *storekit.ClaimRequest) bool {
	live := r.Status == storekit.StatusProcessing && r.LockedUntil.After(now)
	if !r.ExpiresAt.After(now) && !live {
		return true
	}
	return r.Method == req.Method && r.Route == req.Route && r.Fingerprint == req.Fingerprint &&
		(r.Status == storekit.StatusFailed || (r.Status == storekit.StatusProcessing && !live))
}
