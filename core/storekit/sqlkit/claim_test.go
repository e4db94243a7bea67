package sqlkit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/core/storekit"
)

func TestClaimable(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	req := &storekit.ClaimRequest{Method: "POST", Route: "/pay", Fingerprint: "f"}
	rec := func(status storekit.Status, lockedFor, expiresIn time.Duration, fp string) *storekit.Record {
		return &storekit.Record{Method: "POST", Route: "/pay", Fingerprint: fp, Status: status,
			LockedUntil: now.Add(lockedFor), ExpiresAt: now.Add(expiresIn)}
	}
	for name, c := range map[string]struct {
		r    *storekit.Record
		want bool
	}{
		"failed, same request":                  {rec(storekit.StatusFailed, -time.Minute, time.Hour, "f"), true},
		"failed, other fingerprint":             {rec(storekit.StatusFailed, -time.Minute, time.Hour, "g"), false},
		"processing, lease lapsed":              {rec(storekit.StatusProcessing, -time.Second, time.Hour, "f"), true},
		"processing, lease live":                {rec(storekit.StatusProcessing, time.Second, time.Hour, "f"), false},
		"completed":                             {rec(storekit.StatusCompleted, -time.Minute, time.Hour, "f"), false},
		"completed, past retention":             {rec(storekit.StatusCompleted, -time.Minute, 0, "g"), true},
		"past retention, lease live":            {rec(storekit.StatusProcessing, time.Second, -time.Second, "g"), false},
		"past retention, lease lapsed, other":   {rec(storekit.StatusProcessing, 0, -time.Second, "g"), true},
		"lease ends now (lapsed), same request": {rec(storekit.StatusProcessing, 0, time.Hour, "f"), true},
	} {
		assert.Equal(t, c.want, Claimable(c.r, now, req), name)
	}
}
