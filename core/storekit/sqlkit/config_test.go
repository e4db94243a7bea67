package sqlkit

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core/storekit"
)

func TestConfig(t *testing.T) {
	c := NewConfig(time.Hour)
	require.NoError(t, c.Valid("x", 40))
	assert.Equal(t, "idem_records", c.Table)
	assert.Equal(t, time.Hour, c.Margin)
	assert.True(t, c.TxMarked(), "defaults: a read-write transaction is marked")

	c.SetMargin(-time.Second)
	c.SetTxDB(nil)
	c.Table = "bad-name"
	err := c.Valid("x", 40)
	require.Error(t, err, "invalid options accepted")
	assert.True(t, strings.HasPrefix(err.Error(), "x: invalid options: "), "%q", err)
	for _, want := range []string{"retention margin -1s is negative", "tx db is nil", `table name "bad-name" must match`} {
		assert.ErrorContains(t, err, want)
	}
	assert.Equal(t, time.Hour, c.Margin, "refused margin kept")
	assert.Nil(t, c.TxDB, "refused pool kept")

	c.TxOpts = &sql.TxOptions{ReadOnly: true}
	assert.False(t, c.TxMarked(), "a read-only transaction is marked")
}

func TestValidClaim(t *testing.T) {
	ok := storekit.ClaimRequest{Scope: "s", Key: "k", Lease: time.Microsecond, Retention: time.Microsecond}
	assert.NoError(t, ValidClaim(&ok))
	for name, bad := range map[string]storekit.ClaimRequest{
		"lease":       {Lease: time.Microsecond - 1, Retention: time.Hour},
		"retention":   {Lease: time.Hour, Retention: 0},
		"scope":       {Scope: strings.Repeat("s", maxScope+1), Lease: time.Hour, Retention: time.Hour},
		"key":         {Key: strings.Repeat("k", maxKey+1), Lease: time.Hour, Retention: time.Hour},
		"method":      {Method: strings.Repeat("m", maxMethod+1), Lease: time.Hour, Retention: time.Hour},
		"route":       {Route: strings.Repeat("r", maxRoute+1), Lease: time.Hour, Retention: time.Hour},
		"fingerprint": {Fingerprint: strings.Repeat("f", maxFingerprint+1), Lease: time.Hour, Retention: time.Hour},
	} {
		err := ValidClaim(&bad)
		if assert.Error(t, err, name) {
			assert.True(t, strings.HasPrefix(err.Error(), name), "%s: %v", name, err)
		}
	}
}
