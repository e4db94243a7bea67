package fiberidem

import (
	"net/http"
	"strings"

	"github.com/valyala/fasthttp"
)

// requestHeader copies fasthttp's request headers into an http.Header.
// fasthttp hands out keys and values that alias buffers it reuses for the
// next request, and the engine keeps the key (and the store keeps records
// built from it), so every byte is copied — into a single string, of which
// the keys and values are substrings: three allocations whatever the number
// of headers, instead of two per header.
func requestHeader(h *fasthttp.RequestHeader) http.Header {
	var hc headerCopy
	h.VisitAll(func(k, v []byte) { hc.count(k, v) })
	if hc.n == 0 {
		return http.Header{}
	}
	hc.grow()
	h.VisitAll(func(k, v []byte) { hc.write(k, v) })
	hc.seal()
	h.VisitAll(func(k, v []byte) { hc.add(k, v) })
	return hc.out
}

// responseHeader copies the response headers the engine may keep. Set-Cookie
// and Content-Length are never replayed (core refuses them in its
// allow-list), so they are not copied.
func responseHeader(h *fasthttp.ResponseHeader) http.Header {
	var hc headerCopy
	h.VisitAll(func(k, v []byte) {
		if !skipResponseHeader(k) {
			hc.count(k, v)
		}
	})
	if hc.n == 0 {
		return http.Header{}
	}
	hc.grow()
	h.VisitAll(func(k, v []byte) {
		if !skipResponseHeader(k) {
			hc.write(k, v)
		}
	})
	hc.seal()
	h.VisitAll(func(k, v []byte) {
		if !skipResponseHeader(k) {
			hc.add(k, v)
		}
	})
	return hc.out
}

func skipResponseHeader(k []byte) bool {
	switch string(k) { // no allocation: the compiler compares in place
	case fasthttp.HeaderSetCookie, fasthttp.HeaderContentLength:
		return true
	}
	return false
}

// headerCopy builds an http.Header in three passes over the same visitor:
// count, write every byte into one buffer, then slice keys and values out
// of it. The passes see the same headers in the same order (nothing runs in
// between); add falls back to a plain copy if they ever did not.
type headerCopy struct {
	n, size int
	sb      strings.Builder
	all     string
	off     int
	vals    []string
	out     http.Header
}

func (hc *headerCopy) count(k, v []byte) {
	hc.n++
	hc.size += len(k) + len(v)
}

func (hc *headerCopy) grow() { hc.sb.Grow(hc.size) }

func (hc *headerCopy) write(k, v []byte) {
	hc.sb.Write(k)
	hc.sb.Write(v)
}

func (hc *headerCopy) seal() {
	hc.all = hc.sb.String()
	hc.vals = make([]string, 0, hc.n)
	hc.out = make(http.Header, hc.n)
}

func (hc *headerCopy) add(k, v []byte) {
	var key, val string
	if end := hc.off + len(k) + len(v); end <= len(hc.all) &&
		hc.all[hc.off:hc.off+len(k)] == string(k) && hc.all[hc.off+len(k):end] == string(v) {
		key = hc.all[hc.off : hc.off+len(k)]
		val = hc.all[hc.off+len(k) : end]
		hc.off = end
	} else {
		key, val = string(k), string(v)
	}
	// fasthttp normalises names the way net/http does unless the app sets
	// DisableHeaderNormalizing; CanonicalHeaderKey allocates only then.
	key = http.CanonicalHeaderKey(key)
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
