package sqlkit

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestValidIdent(t *testing.T) {
	for _, name := range []string{"idem_records", "_x", "T1"} {
		assert.NoError(t, ValidIdent("table", name, 40), "%q", name)
	}
	for name, want := range map[string]string{
		"":                      "table name is empty",
		"1abc":                  "must match",
		"a-b":                   "must match",
		`a"; DROP TABLE x; --`:  "must match",
		strings.Repeat("a", 41): "longer than 40",
	} {
		assert.ErrorContains(t, ValidIdent("table", name, 40), want, "%q", name)
	}
}
