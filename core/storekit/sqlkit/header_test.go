package sqlkit

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		{},
		{"Content-Type": {"application/json"}},
		{"X-Odd": {"a\x00b", "\xff\xfe", "", "支払い"}, "Link": {"<a>", "<b>"}, "Empty": {}},
	} {
		got, err := parseHeader(AppendHeader(nil, h))
		if assert.NoError(t, err, "%q", h) {
			assert.Equal(t, h, got)
		}
	}
	for _, bad := range [][]byte{nil, {}, {2}, {1}, {1, 1}, {1, 1, 5, 'a'}, {1, 0, 0}, {1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}} {
		_, err := parseHeader(bad)
		assert.ErrorIs(t, err, errBadHeader, "%x", bad)
	}
}

// FuzzParseHeader: any stored bytes decode or fail cleanly (no panic, no
// huge allocation), and what decodes encodes back to the same bytes up to
// map order (checked by decoding again).
func FuzzParseHeader(f *testing.F) {
	f.Add(AppendHeader(nil, http.Header{"A": {"1", "2"}, "B": {""}}))
	f.Add([]byte{1, 1, 1, 'A', 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err != nil {
			return
		}
		again, err := parseHeader(AppendHeader(nil, h))
		require.NoError(t, err, "round trip of %q", h)
		require.Equal(t, h, again, "round trip")
	})
}
