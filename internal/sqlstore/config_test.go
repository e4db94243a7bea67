package sqlstore

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

func TestConfig(t *testing.T) {
	c := NewConfig(time.Hour)
	if err := c.Valid("x", 40); err != nil || c.Table != DefaultTable || c.Margin != time.Hour || !c.TxMarked() {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	c.SetMargin(-time.Second)
	c.SetTxDB(nil)
	c.Table = "bad-name"
	err := c.Valid("x", 40)
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"x: invalid options: ", "retention margin -1s is negative", "tx db is nil", "table"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if c.Margin != time.Hour || c.TxDB != nil {
		t.Errorf("refused values were kept: %+v", c)
	}
	c.TxOpts = &sql.TxOptions{ReadOnly: true}
	if c.TxMarked() {
		t.Error("a read-only transaction is marked")
	}
}

func TestValidClaim(t *testing.T) {
	ok := storekit.ClaimRequest{Scope: "s", Key: "k", Lease: time.Microsecond, Retention: time.Microsecond}
	if err := ValidClaim(&ok); err != nil {
		t.Errorf("valid claim refused: %v", err)
	}
	for name, bad := range map[string]storekit.ClaimRequest{
		"lease":       {Lease: time.Microsecond - 1, Retention: time.Hour},
		"retention":   {Lease: time.Hour, Retention: 0},
		"scope":       {Scope: strings.Repeat("s", MaxScope+1), Lease: time.Hour, Retention: time.Hour},
		"key":         {Key: strings.Repeat("k", MaxKey+1), Lease: time.Hour, Retention: time.Hour},
		"method":      {Method: strings.Repeat("m", MaxMethod+1), Lease: time.Hour, Retention: time.Hour},
		"route":       {Route: strings.Repeat("r", MaxRoute+1), Lease: time.Hour, Retention: time.Hour},
		"fingerprint": {Fingerprint: strings.Repeat("f", MaxFingerprint+1), Lease: time.Hour, Retention: time.Hour},
	} {
		if err := ValidClaim(&bad); err == nil || !strings.HasPrefix(err.Error(), name) {
			t.Errorf("%s: got %v", name, err)
		}
	}
}
