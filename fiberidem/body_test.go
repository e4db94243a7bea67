package fiberidem_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberidem"
)

// gzipBomb returns about 1 MiB of gzip that inflates to 1 GiB of zeros: one
// member of 1 MiB of zeros, repeated (gzip readers read concatenated
// members as one stream).
func gzipBomb(t *testing.T) []byte {
	t.Helper()
	return bytes.Repeat(gzipped(t, make([]byte, 1<<20)), 1<<10)
}

func gzipped(t *testing.T, p []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	require.NoError(t, err)
	_, err = zw.Write(p)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}

// allocatedBy returns the bytes allocated (by every goroutine) while f ran.
func allocatedBy(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// bodyApp serves POST and GET /v1/payments behind idem with a handler that
// reads c.Body(), as a fiber handler does; it reports what the handler saw.
// stream sets fiber.Config.StreamRequestBody.
func bodyApp(t *testing.T, stream bool) (*fiber.App, *[]string) {
	t.Helper()
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace(), core.WithKeyRequired(false), core.WithMaxRequestBytes(2<<20))
	require.NoError(t, err)
	mw, err := fiberidem.New(eng)
	require.NoError(t, err)
	app := fiber.New(fiber.Config{DisableStartupMessage: true, BodyLimit: 4 << 20, StreamRequestBody: stream})
	var seen []string
	h := func(c *fiber.Ctx) error {
		seen = append(seen, string(c.Body()))
		return c.Status(http.StatusCreated).SendString("ok")
	}
	app.Post("/v1/payments", mw, h)
	app.Get("/v1/payments", mw, h)
	return app, &seen
}

func sendBody(t *testing.T, app *fiber.App, method, key, encoding string, body []byte) int {
	t.Helper()
	req := httptest.NewRequest(method, "/v1/payments", bytes.NewReader(body))
	req.Header.Set("Content-Encoding", encoding)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := app.Test(req, -1)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// TestHandlerBodyIsBoundedWhenCompressed: a handler behind idem that calls
// c.Body() on a gzip body of ~1 MiB inflating to 1 GiB does not inflate it
// (fiber's c.Body() would, without bound): the request gets 413 and the
// handler does not run, whether idem protects the request (a key) or lets
// it through (no key, a GET). The allocation bound (64 MiB) is a size,
// not a time.
func TestHandlerBodyIsBoundedWhenCompressed(t *testing.T) {
	bomb := gzipBomb(t)
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "Buffered", true: "Streamed"}[stream], func(t *testing.T) {
			app, seen := bodyApp(t, stream)
			for _, tc := range []struct{ method, key string }{
				{http.MethodPost, "k-bomb"},
				{http.MethodPost, ""},
				{http.MethodGet, ""},
			} {
				var status int
				n := allocatedBy(func() { status = sendBody(t, app, tc.method, tc.key, "gzip", bomb) })
				assert.Equal(t, http.StatusRequestEntityTooLarge, status, "%s key=%q", tc.method, tc.key)
				assert.Less(t, n, uint64(64<<20), "%s key=%q: bytes allocated for a %d KiB body", tc.method, tc.key, len(bomb)>>10)
			}
			assert.Empty(t, *seen, "the handler ran")
			// The refusal is final and recorded: the same request replays it.
			assert.Equal(t, http.StatusRequestEntityTooLarge, sendBody(t, app, http.MethodPost, "k-bomb", "gzip", bomb))
			assert.Empty(t, *seen, "the handler ran on the retry")
		})
	}
}

// TestHandlerBodyDecodedWithinLimit: a compressed body within the limit
// reaches the handler decoded through c.Body(), as fiber hands it, with
// codings undone last first; a body that does not decode gets 400 and an
// unknown coding 415, the handler not running.
func TestHandlerBodyDecodedWithinLimit(t *testing.T) {
	const plain = `{"amount":1000}`
	var br bytes.Buffer
	bw := brotli.NewWriter(&br)
	_, err := bw.Write(gzipped(t, []byte(plain)))
	require.NoError(t, err)
	require.NoError(t, bw.Close())

	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "Buffered", true: "Streamed"}[stream], func(t *testing.T) {
			app, seen := bodyApp(t, stream)
			assert.Equal(t, http.StatusCreated, sendBody(t, app, http.MethodPost, "k-gzip", "gzip", gzipped(t, []byte(plain))))
			assert.Equal(t, http.StatusCreated, sendBody(t, app, http.MethodPost, "", "gzip", gzipped(t, []byte(plain))))
			assert.Equal(t, http.StatusCreated, sendBody(t, app, http.MethodPost, "k-gzip-br", "gzip, br", br.Bytes()))
			assert.Equal(t, []string{plain, plain, plain}, *seen)

			assert.Equal(t, http.StatusBadRequest, sendBody(t, app, http.MethodPost, "k-broken", "gzip", []byte("not gzip")))
			assert.Equal(t, http.StatusUnsupportedMediaType, sendBody(t, app, http.MethodPost, "k-zstd", "zstd", []byte(plain)))
			assert.Len(t, *seen, 3, "the handler ran for a body it could not read")
		})
	}
}
