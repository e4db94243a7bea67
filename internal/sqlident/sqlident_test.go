package sqlident

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for _, name := range []string{"idem_records", "_x", "T1"} {
		if err := Valid("table", name, 40); err != nil {
			t.Errorf("Valid(%q) = %v, want nil", name, err)
		}
	}
	for name, want := range map[string]string{
		"":                      "empty",
		"1abc":                  "must match",
		"a-b":                   "must match",
		`a"; DROP TABLE x; --`:  "must match",
		strings.Repeat("a", 41): "longer than 40",
	} {
		err := Valid("table", name, 40)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Valid(%q) = %v, want an error saying %q", name, err, want)
		}
	}
}
