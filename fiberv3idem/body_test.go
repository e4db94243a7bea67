package fiberv3idem_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/andybalholm/brotli"
	"github.com/gofiber/fiber/v3"
	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberv3idem"
)

// gzipBomb returns about 1 MiB of gzip that inflates to 1 GiB of zeros: one
// member of 1 MiB of zeros, repeated (gzip readers read concatenated
// members as one stream).
func gzipBomb(t *testing.T) []byte {
	t.Helper()
	return bytes.Repeat(gzipped(t, make([]byte, 1<<20)), 1<<10)
}

// zstdBomb returns a few KiB of zstd that inflate to 1 GiB of zeros: 64
// frames of 16 MiB, each declaring an 8 MiB window.
func zstdBomb(t *testing.T) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithEncoderConcurrency(1))
	require.NoError(t, err)
	defer zw.Close()
	return bytes.Repeat(zw.EncodeAll(make([]byte, 16<<20), nil), 64)
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
	mw, err := fiberv3idem.New(eng)
	require.NoError(t, err)
	app := fiber.New(fiber.Config{BodyLimit: 4 << 20, StreamRequestBody: stream})
	var seen []string
	h := func(c fiber.Ctx) error {
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
	status, _, _ := test(t, app, req)
	return status
}

// TestHandlerBodyIsBoundedWhenCompressed: a handler behind idem that calls
// c.Body() on a gzip or zstd body of at most ~1 MiB inflating to 1 GiB
// does not inflate it (fiber's c.Body() would, without bound): the request
// gets 413 and the handler does not run, whether idem protects the request
// (a key) or lets it through (no key, a GET). The allocation bound
// (64 MiB) is a size, not a time.
func TestHandlerBodyIsBoundedWhenCompressed(t *testing.T) {
	bombs := map[string][]byte{"gzip": gzipBomb(t), "zstd": zstdBomb(t)}
	for _, stream := range []bool{false, true} {
		for coding, bomb := range bombs {
			t.Run(map[bool]string{false: "Buffered", true: "Streamed"}[stream]+"/"+coding, func(t *testing.T) {
				app, seen := bodyApp(t, stream)
				for _, tc := range []struct{ method, key string }{
					{http.MethodPost, "k-bomb"},
					{http.MethodPost, ""},
					{http.MethodGet, ""},
				} {
					var status int
					n := allocatedBy(func() { status = sendBody(t, app, tc.method, tc.key, coding, bomb) })
					assert.Equal(t, http.StatusRequestEntityTooLarge, status, "%s key=%q", tc.method, tc.key)
					assert.Less(t, n, uint64(64<<20), "%s key=%q: bytes allocated for a %d KiB body", tc.method, tc.key, len(bomb)>>10)
				}
				assert.Empty(t, *seen, "the handler ran")
				// The refusal is final and recorded: the same request replays it.
				assert.Equal(t, http.StatusRequestEntityTooLarge, sendBody(t, app, http.MethodPost, "k-bomb", coding, bomb))
				assert.Empty(t, *seen, "the handler ran on the retry")
			})
		}
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
	// A streaming zstd writer, as a client compresses (the bomb's frames
	// declare an 8 MiB window, which is accepted too).
	var zs bytes.Buffer
	zw, err := zstd.NewWriter(&zs)
	require.NoError(t, err)
	_, err = zw.Write([]byte(plain))
	require.NoError(t, err)
	require.NoError(t, zw.Close())

	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "Buffered", true: "Streamed"}[stream], func(t *testing.T) {
			app, seen := bodyApp(t, stream)
			assert.Equal(t, http.StatusCreated, sendBody(t, app, http.MethodPost, "k-gzip", "gzip", gzipped(t, []byte(plain))))
			assert.Equal(t, http.StatusCreated, sendBody(t, app, http.MethodPost, "", "gzip", gzipped(t, []byte(plain))))
			assert.Equal(t, http.StatusCreated, sendBody(t, app, http.MethodPost, "k-gzip-br", "gzip, br", br.Bytes()))
			assert.Equal(t, http.StatusCreated, sendBody(t, app, http.MethodPost, "k-zstd", "zstd", zs.Bytes()))
			assert.Equal(t, []string{plain, plain, plain, plain}, *seen)

			assert.Equal(t, http.StatusBadRequest, sendBody(t, app, http.MethodPost, "k-broken", "gzip", []byte("not gzip")))
			assert.Equal(t, http.StatusBadRequest, sendBody(t, app, http.MethodPost, "k-broken-zstd", "zstd", []byte("not zstd")))
			assert.Equal(t, http.StatusUnsupportedMediaType, sendBody(t, app, http.MethodPost, "k-compress", "compress", []byte(plain)))
			assert.Len(t, *seen, 4, "the handler ran for a body it could not read")
		})
	}
}

// TestFingerprintIsOfBytesReceived: the fingerprint covers the body as
// received (compressed), as every other adapter hashes it, while the
// handler still reads it decompressed through c.Body().
func TestFingerprintIsOfBytesReceived(t *testing.T) {
	const plain = `{"amount":1000}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(plain))
	require.NoError(t, zw.Close())

	store := memstore.New()
	app := fiber.New()
	var seen string
	app.Post("/v1/payments", mw(t, newEngine(t, store)), func(c fiber.Ctx) error {
		seen = string(c.Body())
		return c.Status(http.StatusCreated).SendString("ok")
	})
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", bytes.NewReader(gz.Bytes()))
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("Idempotency-Key", "k-gz")
	status, _, _ := test(t, app, req)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, plain, seen, "the handler's c.Body()")
	// The same bytes sent as an opaque body (no Content-Encoding, as an
	// adapter that does not decode sees them) are the same request: a
	// replay, not 422.
	req = httptest.NewRequest(http.MethodPost, "/v1/payments", bytes.NewReader(gz.Bytes()))
	req.Header.Set("Idempotency-Key", "k-gz")
	status, header, _ := test(t, app, req)
	assert.Equal(t, http.StatusCreated, status, "the gzip bytes sent as they are: the fingerprint is over the bytes received")
	assert.Equal(t, "true", header.Get(core.ReplayedHeader))
}

// TestStreamedRequestBody: with fiber.Config.StreamRequestBody the engine
// reads the stream (up to its limit) and the handler still gets the body.
func TestStreamedRequestBody(t *testing.T) {
	app := fiber.New(fiber.Config{StreamRequestBody: true, BodyLimit: 1 << 10})
	app.Post("/echo", mw(t, newEngine(t, nil, core.WithMaxRequestBytes(64<<10))), func(c fiber.Ctx) error {
		return c.Status(http.StatusCreated).Send(c.Body())
	})
	for _, tc := range []struct {
		key  string
		size int
		want int
	}{{"k-small", 100, http.StatusCreated}, {"k-large", 32 << 10, http.StatusCreated}, {"k-over", 128 << 10, http.StatusRequestEntityTooLarge}} {
		body := bytes.Repeat([]byte("x"), tc.size)
		req := httptest.NewRequest(http.MethodPost, "/echo", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", tc.key)
		resp, err := app.Test(req, fiber.TestConfig{Timeout: 0})
		require.NoError(t, err, "%d bytes", tc.size)
		got, _ := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, tc.want, resp.StatusCode, "%d bytes", tc.size)
		if tc.want == http.StatusCreated {
			assert.Equal(t, body, got, "%d bytes: the handler's body", tc.size)
		}
	}
}
