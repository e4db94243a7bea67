package core_test

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestDecideReadsBodyExactly reads bodies of sizes around the initial
// buffer and the limit through readers that return short reads and data
// together with io.EOF.
func TestDecideReadsBodyExactly(t *testing.T) {
	const limit = 2000
	eng, err := core.New(memstore.New(), core.WithMaxRequestBytes(limit), core.WithSharedKeySpace())
	if err != nil {
		t.Fatal(err)
	}
	readers := map[string]func(io.Reader) io.Reader{
		"plain":    func(r io.Reader) io.Reader { return r },
		"one-byte": iotest.OneByteReader,
		"half":     iotest.HalfReader,
		"data-eof": iotest.DataErrReader,
	}
	for name, wrap := range readers {
		for _, n := range []int{0, 1, 511, 512, 513, 1024, 1999, limit, limit + 1, 3 * limit} {
			body := bytes.Repeat([]byte{'x'}, n)
			for i := range body {
				body[i] = byte('a' + i%26)
			}
			key := name + "-" + strconv.Itoa(n)
			d, err := eng.Decide(context.Background(), core.Request{
				Method: "POST", Route: "/p", Header: http.Header{"Idempotency-Key": {key}}, Body: wrap(bytes.NewReader(body)),
			})
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			if n > limit {
				if d.Outcome != core.Reject || d.Response.Status != http.StatusRequestEntityTooLarge {
					t.Errorf("%s: %v %v, want 413", key, d.Outcome, d.Response)
				}
				continue
			}
			if d.Outcome != core.Proceed || !bytes.Equal(d.Body, body) {
				t.Errorf("%s: %v, body of %d bytes differs", key, d.Outcome, len(d.Body))
				continue
			}
			if err := eng.Abort(context.Background(), d, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// WithMaxRequestBytes(math.MaxInt64) is the natural way to say "no limit";
// New accepts it, so Decide must not panic on the first request with a
// body (limit+1 overflowed and the read slice had a negative length).
func TestMaxRequestBytesMaxInt64IsNoLimit(t *testing.T) {
	eng := newEngine(t, memstore.New(), core.WithMaxRequestBytes(math.MaxInt64))
	var d *core.Decision
	require.NotPanics(t, func() { d = proceed(t, eng, request("k", payBody)) })
	require.Equal(t, payBody, string(d.Body))
	require.NoError(t, eng.Commit(context.Background(), d, created("ok")))
}
