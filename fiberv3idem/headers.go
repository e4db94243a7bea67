package fiberv3idem

import (
	"iter"
	"net/http"

	"github.com/gofiber/fiber/v3"
	"github.com/valyala/fasthttp"
)

// requestHeaders is fasthttp's request header as an
// adapterkit.HeaderReader: the engine asks only for the headers it reads
// (the key, those named by core.WithFingerprintHeaders), so only those are
// copied. fasthttp's keys and values alias buffers it reuses for the next
// request, and the engine and the store may keep what they read.
type requestHeaders struct{ h *fasthttp.RequestHeader }

func (r requestHeaders) Values(name string) []string { return values(r.h.All(), name, false) }

// Header copies every header, for a core.WithScope function (it may read
// any).
func (r requestHeaders) Header() http.Header {
	out := http.Header{}
	for k, v := range r.h.All() {
		out.Add(string(k), string(v)) // Add canonicalises the name
	}
	return out
}

// responseHeaders is fasthttp's response header as an
// adapterkit.HeaderReader: Commit asks only for the allow-listed headers.
// noType hides fasthttp's default Content-Type, which fasthttp reports but
// does not send with an empty body: a replay must not gain a header the
// client never saw.
type responseHeaders struct {
	h      *fasthttp.ResponseHeader
	noType bool
}

func (r responseHeaders) Values(name string) []string { return values(r.h.All(), name, r.noType) }

// values copies the values of the header named name (canonical), matched
// as net/http canonicalises names: fasthttp does not when the app sets
// DisableHeaderNormalizing.
func values(all iter.Seq2[[]byte, []byte], name string, noType bool) []string {
	if noType && name == fiber.HeaderContentType {
		return nil
	}
	var vals []string
	for k, v := range all {
		if len(k) == len(name) && (string(k) == name || http.CanonicalHeaderKey(string(k)) == name) {
			vals = append(vals, string(v))
		}
	}
	return vals
}

// implicitContentType reports whether the response's Content-Type is
// fasthttp's default rather than one the handler set (fasthttp keeps no
// other record of it).
func implicitContentType(c fiber.Ctx) bool {
	rh := &c.Response().Header
	if string(rh.ContentType()) != defaultContentType {
		return false // none, or one the handler set
	}
	rh.SetNoDefaultContentType(true)
	explicit := len(rh.ContentType()) > 0
	// Put the setting back: the app's when the default may have been off,
	// off when it showed.
	rh.SetNoDefaultContentType(explicit && c.App().Config().DisableDefaultContentType)
	return !explicit
}

// defaultContentType is fasthttp's default response Content-Type.
const defaultContentType = "text/plain; charset=utf-8"
