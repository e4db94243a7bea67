package core_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/core"
)

func TestParseKey(t *testing.T) {
	valid := map[string][]string{
		"8e03978e-40d5-43e8-bc93-6894a57f9324": {"8e03978e-40d5-43e8-bc93-6894a57f9324"},
		"abc":                                  {`"abc"`},
		"padded":                               {" \tpadded\t "},
		"quoted padded":                        {`  "quoted padded"  `},
		`with "quotes" and \ slash`:            {`"with \"quotes\" and \\ slash"`},
		"a":                                    {"a"},
		"~!#$%&'()*+-./:;<=>?@[]^_`{|}":        {"~!#$%&'()*+-./:;<=>?@[]^_`{|}"},
		strings.Repeat("x", 255):               {strings.Repeat("x", 255)},
		strings.Repeat("q", 255) + "":          {`"` + strings.Repeat("q", 255) + `"`},
		strings.Repeat(`"`, 255):               {`"` + strings.Repeat(`\"`, 255) + `"`},
		"sp ace":                               {`"sp ace"`},
	}
	for want, vals := range valid {
		got, err := core.ParseKey(vals)
		if assert.NoError(t, err, "%q", vals) {
			assert.Equal(t, want, got, "%q", vals)
		}
	}

	_, err := core.ParseKey(nil)
	assert.ErrorIs(t, err, core.ErrKeyMissing)
	_, err = core.ParseKey([]string{})
	assert.ErrorIs(t, err, core.ErrKeyMissing)

	invalid := map[string][]string{
		"two lines":             {"a", "b"},
		"two identical lines":   {"a", "a"},
		"empty":                 {""},
		"blank":                 {" \t "},
		"empty quoted":          {`""`},
		"256 bytes":             {strings.Repeat("x", 256)},
		"256 quoted":            {`"` + strings.Repeat("x", 256) + `"`},
		"256 after unescape":    {`"` + strings.Repeat(`\\`, 256) + `"`},
		"huge":                  {strings.Repeat("x", 1<<20)},
		"space inside raw":      {"a b"},
		"tab inside":            {"a\tb"},
		"tab inside quoted":     {"\"a\tb\""},
		"NUL":                   {"a\x00b"},
		"DEL":                   {"a\x7fb"},
		"newline":               {"a\nb"},
		"non-ascii raw":         {"clé"},
		"non-ascii quoted":      {`"clé"`},
		"list raw":              {"a,b"},
		"list quoted":           {`"a", "b"`},
		"parameter":             {`"a";x=1`},
		"raw quote":             {`a"b`},
		"raw backslash":         {`a\b`},
		"unterminated":          {`"abc`},
		"lone quote":            {`"`},
		"bad escape":            {`"a\nb"`},
		"trailing backslash":    {`"abc\`},
		"data after close":      {`"abc"x`},
		"escaped closing quote": {`"abc\"`},
	}
	for name, vals := range invalid {
		key, err := core.ParseKey(vals)
		if assert.Error(t, err, "%s: got key %q", name, key) {
			assert.ErrorIs(t, err, core.ErrKeyInvalid, name)
			assert.False(t, errors.Is(err, core.ErrKeyMissing), name)
			assert.Empty(t, key, name)
			assert.NotContains(t, err.Error(), strings.Repeat("x", 20), "%s: the error must not echo the key", name)
		}
	}
}
