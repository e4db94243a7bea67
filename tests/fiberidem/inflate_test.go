package fiberidem_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/fiberidem"
)

// gzipBomb returns about 1 MiB of gzip that inflates to 1 GiB of zeros: one
// member of 1 MiB of zeros, repeated (gzip readers, fasthttp's included,
// read concatenated members as one stream).
func gzipBomb(t *testing.T) []byte {
	t.Helper()
	var member bytes.Buffer
	zw, err := gzip.NewWriterLevel(&member, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.Repeat(member.Bytes(), 1<<10)
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

// TestCompressedBodyIsNotInflated: a gzip body of ~1 MiB that inflates to
// 1 GiB, sent with Content-Encoding: gzip to a protected route (with and
// without a key) and to a GET, costs what the bytes received cost: idem
// reads the body only for a protected request with a valid key, as
// received, never inflated. The allocation bound (64 MiB) is a size, not a
// time: inflating would allocate more than 1 GiB.
func TestCompressedBodyIsNotInflated(t *testing.T) {
	bomb := gzipBomb(t)
	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace(), core.WithMaxRequestBytes(4<<20))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := fiberidem.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true, BodyLimit: 8 << 20})
	ok := func(c *fiber.Ctx) error { return c.Status(http.StatusCreated).SendString("ok") }
	app.Post("/v1/payments", mw, ok)
	app.Get("/v1/payments", mw, ok)

	for _, tc := range []struct {
		method, key string
		want        int
	}{
		{http.MethodPost, "k-bomb", http.StatusCreated},
		{http.MethodPost, "", http.StatusBadRequest},
		{http.MethodGet, "k-bomb-get", http.StatusCreated},
	} {
		var status int
		n := allocatedBy(func() {
			req := httptest.NewRequest(tc.method, "/v1/payments", bytes.NewReader(bomb))
			req.Header.Set("Content-Encoding", "gzip")
			if tc.key != "" {
				req.Header.Set("Idempotency-Key", tc.key)
			}
			resp, err := app.Test(req, -1)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status = resp.StatusCode
		})
		if status != tc.want {
			t.Errorf("%s key=%q: %d, want %d", tc.method, tc.key, status, tc.want)
		}
		if n > 64<<20 {
			t.Errorf("%s key=%q: %d MiB allocated for a %d KiB body, want < 64 MiB (the body was inflated)", tc.method, tc.key, n>>20, len(bomb)>>10)
		}
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
	_ = zw.Close()

	store := memstore.New()
	eng, err := core.New(store, core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	mw, err := fiberidem.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	var seen string
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/v1/payments", mw, func(c *fiber.Ctx) error {
		seen = string(c.Body())
		return c.Status(http.StatusCreated).SendString("ok")
	})
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", bytes.NewReader(gz.Bytes()))
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("Idempotency-Key", "k-gz")
	resp, err := app.Test(req, -1)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || seen != plain {
		t.Fatalf("first: %d, handler saw %q, want 201 and %q", resp.StatusCode, seen, plain)
	}
	rec, err := store.Get(t.Context(), "", "k-gz")
	if err != nil {
		t.Fatal(err)
	}
	want := core.Fingerprint(core.FingerprintInput{Method: "POST", Route: "/v1/payments", Target: "/v1/payments", Body: gz.Bytes()})
	if rec.Fingerprint != want {
		t.Errorf("fingerprint %s, want %s (over the gzip bytes as received)", rec.Fingerprint, want)
	}
}

// TestStreamedRequestBody: with fiber.Config.StreamRequestBody the engine
// reads the stream (up to its limit) and the handler still gets the body.
func TestStreamedRequestBody(t *testing.T) {
	eng, err := core.New(memstore.New(), core.WithSharedKeySpace(), core.WithMaxRequestBytes(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := fiberidem.New(eng)
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true, StreamRequestBody: true, BodyLimit: 1 << 10})
	app.Post("/echo", mw, func(c *fiber.Ctx) error { return c.Status(http.StatusCreated).Send(c.Body()) })
	for _, tc := range []struct {
		key  string
		size int
		want int
	}{{"k-small", 100, http.StatusCreated}, {"k-large", 32 << 10, http.StatusCreated}, {"k-over", 128 << 10, http.StatusRequestEntityTooLarge}} {
		body := bytes.Repeat([]byte("x"), tc.size)
		req := httptest.NewRequest(http.MethodPost, "/echo", bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", tc.key)
		resp, err := app.Test(req, -1)
		if err != nil {
			t.Fatalf("%d bytes: %.80v", tc.size, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || (tc.want == http.StatusCreated && !bytes.Equal(got, body)) {
			t.Errorf("%d bytes: %d, %d bytes back, want %d and the body", tc.size, resp.StatusCode, len(got), tc.want)
		}
	}
}
