package pgstore

import (
	"encoding/json"
	"strings"
)

// headerJSON encodes response headers for resp_header (jsonb): a JSON
// object of string arrays, as encoding/json writes a map[string][]string.
// encoding/json writes NUL as \u0000, which PostgreSQL cannot store in jsonb
// (or text): it rejects the whole statement, which would leave a completed
// execution unrecorded. So NUL goes as U+FFFD, as invalid UTF-8 already
// does; a field value cannot carry NUL anyway (RFC 9110, 5.5), so nothing a
// client could have received is lost.
func headerJSON(h map[string][]string) string {
	if hasNUL(h) {
		h = replaceNUL(h)
	}
	b, _ := json.Marshal(h) // a map of string slices always encodes
	return string(b)
}

func hasNUL(h map[string][]string) bool {
	for name, vals := range h {
		if strings.IndexByte(name, 0) >= 0 {
			return true
		}
		for _, v := range vals {
			if strings.IndexByte(v, 0) >= 0 {
				return true
			}
		}
	}
	return false
}

// replaceNUL returns a copy of h with every NUL as U+FFFD.
func replaceNUL(h map[string][]string) map[string][]string {
	out := make(map[string][]string, len(h))
	for name, vals := range h {
		var vs []string
		if vals != nil {
			vs = make([]string, len(vals))
			for i, v := range vals {
				vs[i] = strings.ReplaceAll(v, "\x00", "\uFFFD")
			}
		}
		out[strings.ReplaceAll(name, "\x00", "\uFFFD")] = vs
	}
	return out
}
