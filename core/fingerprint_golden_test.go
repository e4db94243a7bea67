package core_test

import (
	"net/http"
	"testing"

	"github.com/idemkit/idem/core"
)

// TestFingerprintGolden pins the fingerprint and relay-key encodings: they
// are persisted (records) and sent to providers (relay keys), so an
// optimisation must never change a single bit of them. The values were
// produced by the first implementation.
func TestFingerprintGolden(t *testing.T) {
	h := http.Header{"Accept": {"application/json", "text/plain"}, "X-Tenant": {"t1"}}
	cases := []struct {
		in   core.FingerprintInput
		want string
	}{
		{core.FingerprintInput{Method: "POST", Route: "/v1/payments", Body: []byte(`{"amount":1000,"currency":"JPY","to":"alice"}`)},
			"dfc677705bff7f80e09867a974d28d76f46cd6a2e23f1e28a3037723f1970e86"},
		{core.FingerprintInput{Method: "post", Route: "/v1/payments", Body: nil},
			"cb4368814df855d57920561caf8c4065e32c2a33d27ac7ca1c9236370838ee9d"},
		{core.FingerprintInput{Method: "PATCH", Route: "/a/:id", Body: []byte(`{"b":1, "a":[1,2]}`), CanonicalJSON: true},
			"c13e095d10257b8898bc51161623b643c333aa94e1027909da16dc9562de55b7"},
		{core.FingerprintInput{Method: "PATCH", Route: "/a/:id", Body: []byte(`not json`), CanonicalJSON: true},
			"bf71a9b85bc0a76cc30b849ce9c840850fea57ce1c4eee1fbf064aacb580dbb8"},
		{core.FingerprintInput{Method: "POST", Route: "/r", Body: []byte("x"), Header: h, Headers: []string{"x-tenant", "accept", "missing"}},
			"0757b7f6ee459feea4728bac122e601a4a3daa85afb1de15ceef9e854ceffdbb"},
		{core.FingerprintInput{Method: "POST", Route: string(make([]byte, 300)), Body: make([]byte, 70000)},
			"78933ccb0383baa504792d8bfb1531a117bfb9bd77a8a43cb447ed4a4f5e5e84"},
	}
	for i, c := range cases {
		if got := core.Fingerprint(c.in); got != c.want {
			t.Errorf("case %d: fingerprint %s, want %s", i, got, c.want)
		}
	}
	// The relay keys' golden values: TestRelayKeyGolden.
}
