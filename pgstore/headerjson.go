package pgstore

import "unicode/utf8"

// The stored headers (resp_header, jsonb) are a JSON object of string
// arrays, {"Name": ["v", ...]}, as encoding/json writes a map[string][]string.
// appendHeaderJSON writes that format directly: no reflection, one buffer
// (encoding/json costs ~10 allocations for three headers), and it never
// produces what jsonb refuses.

// appendHeaderJSON appends h as a JSON object. A nil value slice is written
// as null, as encoding/json does. Object keys come in map order; jsonb
// keeps its own order anyway.
func appendHeaderJSON(b []byte, h map[string][]string) []byte {
	b = append(b, '{')
	first := true
	for name, vals := range h {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, name)
		b = append(b, ':')
		if vals == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for i, v := range vals {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string. Like encoding/json it writes
// each invalid UTF-8 byte as U+FFFD. Unlike it, it also writes NUL as
// U+FFFD: PostgreSQL cannot store U+0000 in jsonb (or text) and rejects the
// whole statement, which would leave a completed execution unrecorded. A
// field value cannot carry NUL anyway (RFC 9110, 5.5), so nothing a client
// could have received is lost.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == 0:
				b = append(b, "\ufffd"...)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, "\ufffd"...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
