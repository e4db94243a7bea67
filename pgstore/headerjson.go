package pgstore

import (
	"encoding/json"
	"errors"
	"strings"
	"unicode/utf8"
)

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

// parseHeaderJSON decodes stored headers as PostgreSQL prints a jsonb
// object of string arrays ({"Name": ["v", ...], ...}, any whitespace, any
// escape) with a handful of allocations: one string for the whole input,
// whose unescaped values are substrings, one array for all values, the
// map. encoding/json costs ~13 for three headers, on every replay. Any other
// shape is an error; the caller then falls back to encoding/json, so the
// two never disagree on what they both accept (FuzzParseHeaderJSON).
func parseHeaderJSON(b []byte) (map[string][]string, error) {
	p := headerParser{src: string(b)}
	type entry struct {
		name       string
		start, end int // in vals; start < 0: null
	}
	var (
		buf     [8]entry
		entries = buf[:0]
		vals    = make([]string, 0, 8)
	)
	if !p.consume('{') {
		return nil, errHeaderJSON
	}
	if !p.consume('}') {
		for {
			name, ok := p.str()
			if !ok || !p.consume(':') {
				return nil, errHeaderJSON
			}
			e := entry{name: name, start: len(vals)}
			switch {
			case p.consumeWord("null"):
				e.start = -1
			case p.consume('['):
				if !p.consume(']') {
					for {
						v, ok := p.str()
						if !ok {
							return nil, errHeaderJSON
						}
						vals = append(vals, v)
						if p.consume(']') {
							break
						}
						if !p.consume(',') {
							return nil, errHeaderJSON
						}
					}
				}
			default:
				return nil, errHeaderJSON
			}
			e.end = len(vals)
			entries = append(entries, e)
			if p.consume('}') {
				break
			}
			if !p.consume(',') {
				return nil, errHeaderJSON
			}
		}
	}
	p.space()
	if p.i != len(p.src) {
		return nil, errHeaderJSON
	}
	h := make(map[string][]string, len(entries))
	for _, e := range entries {
		if e.start < 0 {
			h[e.name] = nil
			continue
		}
		// Capped: an append by the caller reallocates instead of writing
		// into the next header's values.
		h[e.name] = vals[e.start:e.end:e.end]
	}
	return h, nil
}

var errHeaderJSON = errors.New("pgstore: stored headers: not a JSON object of string arrays")

type headerParser struct {
	src string
	i   int
}

func (p *headerParser) space() {
	for p.i < len(p.src) {
		switch p.src[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *headerParser) consume(c byte) bool {
	p.space()
	if p.i < len(p.src) && p.src[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *headerParser) consumeWord(w string) bool {
	p.space()
	if strings.HasPrefix(p.src[p.i:], w) {
		p.i += len(w)
		return true
	}
	return false
}

// str reads a JSON string: a substring of src when it has no escapes,
// else a new string decoded by encoding/json.
func (p *headerParser) str() (string, bool) {
	p.space()
	if p.i >= len(p.src) || p.src[p.i] != '"' {
		return "", false
	}
	start := p.i + 1
	for j := start; j < len(p.src); j++ {
		switch c := p.src[j]; {
		case c == '"':
			s := p.src[start:j]
			if !utf8.ValidString(s) {
				return "", false // PostgreSQL prints valid UTF-8; leave the rest to encoding/json
			}
			p.i = j + 1
			return s, true
		case c == '\\':
			return p.escaped(start)
		case c < 0x20:
			return "", false
		}
	}
	return "", false
}

// escaped decodes a string with escapes starting at src[start:] (just
// after the opening quote), by encoding/json, which knows every escape.
func (p *headerParser) escaped(start int) (string, bool) {
	for j := start; j < len(p.src); j++ {
		switch p.src[j] {
		case '\\':
			j++ // skip the escaped byte (a \u's hex digits need no care)
		case '"':
			var s string
			if err := json.Unmarshal([]byte(p.src[start-1:j+1]), &s); err != nil {
				return "", false
			}
			p.i = j + 1
			return s, true
		}
	}
	return "", false
}
