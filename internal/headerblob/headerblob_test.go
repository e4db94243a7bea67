package headerblob

import (
	"net/http"
	"reflect"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		{},
		{"Content-Type": {"application/json"}},
		{"X-Odd": {"a\x00b", "\xff\xfe", "", "支払い"}, "Link": {"<a>", "<b>"}, "Empty": {}},
	} {
		got, err := Parse(Append(nil, h))
		if err != nil || !reflect.DeepEqual(got, h) {
			t.Errorf("%q: got %q, %v", h, got, err)
		}
	}
	for _, bad := range [][]byte{nil, {}, {2}, {1}, {1, 1}, {1, 1, 5, 'a'}, {1, 0, 0}, {1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%x: accepted", bad)
		}
	}
}

// FuzzParseHeader: any stored bytes decode or fail cleanly (no panic, no
// huge allocation), and what decodes encodes back to the same bytes up to
// map order (checked by decoding again).
func FuzzParseHeader(f *testing.F) {
	f.Add(Append(nil, http.Header{"A": {"1", "2"}, "B": {""}}))
	f.Add([]byte{1, 1, 1, 'A', 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse(b)
		if err != nil {
			return
		}
		again, err := Parse(Append(nil, h))
		if err != nil || !reflect.DeepEqual(again, h) {
			t.Fatalf("round trip of %q: %q, %v", h, again, err)
		}
	})
}
