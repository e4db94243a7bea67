package fiberidem

import (
	"net/http"
	"strings"

	"github.com/valyala/fasthttp"
)

// requestHeader copies fasthttp's request headers into an http.Header.
// fasthttp hands out keys and values that alias buffers it reuses for the
// next request, and the engine keeps the key (and the store keeps records
// built from it), so every byte is copied. Common names and values come
// from constants; the other bytes are copied into one string of which keys
// and values are substrings: a handful of allocations whatever the number
// of headers, instead of two per header.
func requestHeader(h *fasthttp.RequestHeader) http.Header {
	var hc headerCopy
	for k, v := range h.All() {
		hc.count(k, v)
	}
	hc.init()
	for k, v := range h.All() {
		hc.add(k, v)
	}
	return hc.out
}

// requestHeaders is fasthttp's request header as a adapterkit.HeaderReader: the
// engine asks only for the headers it reads (the key, and those named by
// WithFingerprintHeaders), so only those are copied. The match is the
// one requestHeader makes: the name as net/http canonicalises it.
type requestHeaders fasthttp.RequestHeader

func (r *requestHeaders) Values(name string) []string {
	var vals []string
	for k, v := range (*fasthttp.RequestHeader)(r).All() {
		if nameIs(k, name) {
			vals = append(vals, valueOf(v))
		}
	}
	return vals
}

// Header copies every header, for a core.WithScope function (it may read
// any).
func (r *requestHeaders) Header() http.Header {
	return requestHeader((*fasthttp.RequestHeader)(r))
}

// responseHeaders is fasthttp's response header as a adapterkit.HeaderReader:
// Commit asks only for the allow-listed headers, so only those are copied.
type responseHeaders fasthttp.ResponseHeader

func (r *responseHeaders) Values(name string) []string {
	var vals []string
	for k, v := range (*fasthttp.ResponseHeader)(r).All() {
		if nameIs(k, name) {
			vals = append(vals, valueOf(v))
		}
	}
	return vals
}

// nameIs reports whether http.CanonicalHeaderKey(string(k)) == name, for
// a canonical name, allocating only for a name fasthttp did not normalise
// (DisableHeaderNormalizing).
func nameIs(k []byte, name string) bool {
	if string(k) == name {
		return true
	}
	if len(k) != len(name) {
		return false
	}
	for i := range k {
		a, b := k[i], name[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return http.CanonicalHeaderKey(string(k)) == name
}

// valueOf copies v, or returns the constant for a common value.
func valueOf(v []byte) string {
	if s := knownValue(v); s != "" {
		return s
	}
	return string(v)
}

// responseHeader copies the response headers the engine may keep. Set-Cookie
// and Content-Length are never replayed (core refuses them in its
// allow-list), so they are not copied.
func responseHeader(h *fasthttp.ResponseHeader) http.Header {
	var hc headerCopy
	hc.skipNeverKept = true
	for k, v := range h.All() {
		hc.count(k, v)
	}
	hc.init()
	for k, v := range h.All() {
		hc.add(k, v)
	}
	return hc.out
}

// headerCopy builds an http.Header in two passes over a header visitor:
// count (entries, and bytes that need copying), then add.
type headerCopy struct {
	skipNeverKept bool
	n, size       int
	sb            strings.Builder
	vals          []string
	out           http.Header
}

func (hc *headerCopy) skip(k []byte) bool {
	if !hc.skipNeverKept {
		return false
	}
	switch string(k) { // compared in place, no allocation
	case fasthttp.HeaderSetCookie, fasthttp.HeaderContentLength:
		return true
	}
	return false
}

func (hc *headerCopy) count(k, v []byte) {
	if hc.skip(k) {
		return
	}
	hc.n++
	if knownName(k) == "" {
		hc.size += len(k)
	}
	if knownValue(v) == "" {
		hc.size += len(v)
	}
}

func (hc *headerCopy) init() {
	hc.sb.Grow(hc.size)
	hc.vals = make([]string, 0, hc.n)
	hc.out = make(http.Header, hc.n)
}

func (hc *headerCopy) add(k, v []byte) {
	if hc.skip(k) {
		return
	}
	key := knownName(k)
	if key == "" {
		// fasthttp normalises names as net/http does unless the app sets
		// DisableHeaderNormalizing; CanonicalHeaderKey allocates only then.
		key = http.CanonicalHeaderKey(hc.copy(k))
	}
	val := knownValue(v)
	if val == "" && len(v) > 0 {
		val = hc.copy(v)
	}
	if old, ok := hc.out[key]; ok {
		hc.out[key] = append(old, val)
		return
	}
	if len(hc.vals) < cap(hc.vals) {
		i := len(hc.vals)
		hc.vals = append(hc.vals, val)
		hc.out[key] = hc.vals[i : i+1 : i+1]
		return
	}
	hc.out[key] = []string{val}
}

// copy appends b to the builder and returns the copy, a substring of the
// builder's string. A strings.Builder never modifies bytes it has written
// (it grows by copying), so earlier substrings stay valid as it grows.
func (hc *headerCopy) copy(b []byte) string {
	start := hc.sb.Len()
	hc.sb.Write(b)
	return hc.sb.String()[start:]
}

// knownName returns the constant for a common header name, or "".
func knownName(k []byte) string {
	switch string(k) {
	case "Accept":
		return "Accept"
	case "Accept-Encoding":
		return "Accept-Encoding"
	case "Accept-Language":
		return "Accept-Language"
	case "Authorization":
		return "Authorization"
	case "Cache-Control":
		return "Cache-Control"
	case "Connection":
		return "Connection"
	case "Content-Disposition":
		return "Content-Disposition"
	case "Content-Encoding":
		return "Content-Encoding"
	case "Content-Language":
		return "Content-Language"
	case "Content-Length":
		return "Content-Length"
	case "Content-Location":
		return "Content-Location"
	case "Content-Type":
		return "Content-Type"
	case "Cookie":
		return "Cookie"
	case "Etag", "ETag":
		return "Etag" // as net/http canonicalises it
	case "Host":
		return "Host"
	case "Idempotency-Key":
		return "Idempotency-Key"
	case "Last-Modified":
		return "Last-Modified"
	case "Link":
		return "Link"
	case "Location":
		return "Location"
	case "Origin":
		return "Origin"
	case "Preference-Applied":
		return "Preference-Applied"
	case "Referer":
		return "Referer"
	case "Server":
		return "Server"
	case "User-Agent":
		return "User-Agent"
	case "Vary":
		return "Vary"
	case "X-Forwarded-For":
		return "X-Forwarded-For"
	case "X-Request-Id":
		return "X-Request-Id"
	}
	return ""
}

// knownValue returns the constant for a common header value, or "".
func knownValue(v []byte) string {
	switch string(v) {
	case "application/json":
		return "application/json"
	case "application/json; charset=utf-8":
		return "application/json; charset=utf-8"
	case "application/problem+json":
		return "application/problem+json"
	case "text/plain; charset=utf-8":
		return "text/plain; charset=utf-8"
	case "text/html; charset=utf-8":
		return "text/html; charset=utf-8"
	case "*/*":
		return "*/*"
	case "gzip":
		return "gzip"
	case "keep-alive":
		return "keep-alive"
	case "close":
		return "close"
	}
	return ""
}
