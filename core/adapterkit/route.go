package adapterkit

import "strings"

// CanonicalRoute returns the canonical form of a route template, the one the
// engine records and fingerprints, so that every framework's spelling of one
// route is the same record: a fleet that mixes frameworks on one store, or
// migrates from one to another in a rolling deploy, replays across them.
//
//   - A method prefix ("POST /v1/payments", http.ServeMux) and a host
//     ("POST api.example.com/v1/payments") are dropped: the method is
//     recorded on its own.
//   - A named parameter is written {name}, whatever the framework's
//     spelling: ":id" (gin, echo, fiber, httprouter), "{id}" (ServeMux,
//     chi, gorilla), with any constraint or optional mark dropped
//     (fiber ":id<int>", ":id?"; chi "{id:[0-9]+}").
//   - A catch-all is written {*}: gin "*path", echo and fiber "*",
//     ServeMux "{path...}". ServeMux's end anchor "{$}" is dropped.
//   - A backslash escapes the next character and is kept ("\:" is a
//     literal colon in echo and fiber; nethttpidem escapes the colons and
//     asterisks of ServeMux patterns, which are literal there).
//
// Everything else is kept as written. A template already canonical is
// returned as is, without allocating. The result is part of the
// fingerprint: changing this function changes fingerprints, which
// TestFingerprintGolden pins.
func CanonicalRoute(template string) string {
	t := template
	if i := strings.IndexByte(t, ' '); i >= 0 && (strings.IndexByte(t, '/') < 0 || i < strings.IndexByte(t, '/')) {
		// "METHOD [HOST]/PATH": drop the method, then the host.
		t = strings.TrimLeft(t[i:], " ")
	}
	if t != "" && t[0] != '/' {
		if j := strings.IndexByte(t, '/'); j > 0 && isHost(t[:j]) {
			t = t[j:] // "host/path"
		}
	}
	if !strings.ContainsAny(t, ":*{\\") || canonical(t) {
		return t
	}
	var b strings.Builder
	b.Grow(len(t) + 4)
	for i := 0; i < len(t); {
		c := t[i]
		switch {
		case c == '\\' && i+1 < len(t):
			b.WriteString(t[i : i+2]) // kept escaped: the form is a fixed point
			i += 2
		case c == ':' && i+1 < len(t) && isNameByte(t[i+1]):
			j := i + 1
			for j < len(t) && isNameByte(t[j]) {
				j++
			}
			name := t[i+1 : j]
			if j < len(t) && t[j] == '<' { // fiber constraint ":id<int>"
				if k := strings.IndexByte(t[j:], '>'); k >= 0 {
					j += k + 1
				}
			}
			if j < len(t) && t[j] == '?' { // fiber optional ":id?"
				j++
			}
			b.WriteString("{" + name + "}")
			i = j
		case c == '*':
			j := i + 1
			for j < len(t) && (isNameByte(t[j])) { // gin "*path", fiber "*1"
				j++
			}
			b.WriteString("{*}")
			i = j
		case c == '{':
			depth, j := 0, i
			for ; j < len(t); j++ {
				if t[j] == '{' {
					depth++
				} else if t[j] == '}' {
					depth--
					if depth == 0 {
						break
					}
				}
			}
			if j == len(t) { // unbalanced: keep the rest as written
				b.WriteString(t[i:])
				i = j
				break
			}
			inner := t[i+1 : j]
			if k := strings.IndexByte(inner, ':'); k >= 0 { // chi "{id:regex}"
				inner = inner[:k]
			}
			switch {
			case inner == "$":
			case inner == "*" || strings.HasSuffix(inner, "..."):
				b.WriteString("{*}")
			default:
				b.WriteString("{" + inner + "}")
			}
			i = j + 1
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

// canonical reports whether t needs no rewriting: its only special
// characters are plain {name} and {*} parameters.
func canonical(t string) bool {
	for i := 0; i < len(t); i++ {
		switch t[i] {
		case ':', '*':
			return false
		case '\\':
			i++ // escaped
		case '{':
			j := strings.IndexByte(t[i:], '}')
			if j < 0 {
				return false
			}
			inner := t[i+1 : i+j]
			if inner == "*" {
				i += j
				continue
			}
			if inner == "" || inner == "$" || strings.HasSuffix(inner, "...") {
				return false
			}
			for k := 0; k < len(inner); k++ {
				if !isNameByte(inner[k]) {
					return false
				}
			}
			i += j
		}
	}
	return true
}

func isNameByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// isHost reports whether s looks like the host of a ServeMux pattern.
func isHost(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c != '.' && c != '-' && !isNameByte(c) {
			return false
		}
	}
	return true
}
