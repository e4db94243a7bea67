package fiberv3idem

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/gofiber/fiber/v3"
	"github.com/klauspost/compress/zstd"
)

// boundBody makes c.Body() safe for the handlers behind idem. fiber's
// c.Body() inflates a gzip, deflate, brotli or zstd body without any
// bound: a request of a few hundred kilobytes that inflates to gigabytes
// takes the process down. boundBody decodes such a body itself, up to
// limit bytes, puts the decoded bytes in the request and drops
// Content-Encoding, so that c.Body() returns them as they are. A body that
// inflates past limit gets 413, one that does not decode 400, and an
// unknown coding 415 (RFC 9110 §15.5.16): the handler does not run. idem
// fingerprints the body as received before this (every adapter hashes the
// bytes on the wire).
func boundBody(c fiber.Ctx, limit int64) error {
	h := &c.Request().Header
	enc := h.Peek(fiber.HeaderContentEncoding)
	if len(enc) == 0 {
		return nil
	}
	codings := strings.Split(string(enc), ",")
	var body []byte
	if c.Request().IsBodyStream() {
		// fiber.Config.StreamRequestBody, a request idem did not read:
		// c.Request().Body() would read the stream without bound too.
		var err error
		body, err = io.ReadAll(io.LimitReader(c.Request().BodyStream(), limit+1))
		if err == nil && int64(len(body)) > limit {
			err = fiber.NewError(fiber.StatusRequestEntityTooLarge, "request body exceeds the limit")
		}
		if err != nil {
			// The rest of the body is still on the connection.
			c.RequestCtx().SetConnectionClose()
			var fe *fiber.Error
			if !errors.As(err, &fe) {
				err = fiber.NewError(fiber.StatusBadRequest, "request body could not be read")
			}
			return err
		}
	} else {
		body = c.Request().Body()
	}
	// Codings are listed in the order they were applied: undo the last
	// first.
	for i := len(codings) - 1; i >= 0; i-- {
		var err error
		if body, err = decode(strings.ToLower(strings.TrimSpace(codings[i])), body, limit); err != nil {
			return err
		}
	}
	c.Request().SetBodyRaw(body)
	h.Del(fiber.HeaderContentEncoding)
	return nil
}

// decode undoes one content coding of body, reading at most limit bytes.
func decode(coding string, body []byte, limit int64) ([]byte, error) {
	var (
		r   io.Reader
		err error
	)
	switch coding {
	case "", "identity":
		return body, nil
	case "gzip", "x-gzip":
		r, err = gzip.NewReader(bytes.NewReader(body))
	case "deflate": // zlib-wrapped, as fasthttp and net/http read it
		r, err = zlib.NewReader(bytes.NewReader(body))
	case "br":
		r = brotli.NewReader(bytes.NewReader(body))
	case "zstd":
		// Decoded in this goroutine (concurrency 1), with a window of at
		// most 8 MiB (what RFC 8878 asks every decoder to support): the
		// decoder allocates its window up front, the output is bounded
		// below.
		var zr *zstd.Decoder
		zr, err = zstd.NewReader(bytes.NewReader(body), zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(8<<20))
		if err == nil {
			defer zr.Close()
			r = zr
		}
	default:
		return nil, fiber.NewError(fiber.StatusUnsupportedMediaType, "unsupported Content-Encoding")
	}
	if err == nil {
		body, err = io.ReadAll(io.LimitReader(r, limit+1))
	}
	if err != nil {
		return nil, fiber.NewError(fiber.StatusBadRequest, "request body does not decode as its Content-Encoding says")
	}
	if int64(len(body)) > limit {
		return nil, fiber.NewError(fiber.StatusRequestEntityTooLarge, "request body inflates past the limit")
	}
	return body, nil
}
