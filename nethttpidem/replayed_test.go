package nethttpidem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
	"github.com/idemkit/idem/core/openapi"
	"github.com/idemkit/idem/nethttpidem"
)

// TestReplayedHeaderName: with core.WithReplayedHeader("Idempotency-Replayed")
// a replay carries that header and not Stripe's Idempotent-Replayed; the
// first response carries neither, even when the handler set the marker
// itself (it is never stored); the published policy names it.
func TestReplayedHeaderName(t *testing.T) {
	eng := newEngine(t, memstore.New(), core.WithReplayedHeader("idempotency-replayed"))
	mw, err := nethttpidem.New(eng)
	require.NoError(t, err)
	var runs atomic.Int64
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.Header().Set("Idempotency-Replayed", "false") // a handler's own: not the marker
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "paid")
	})))
	defer srv.Close()
	send := func() *http.Response {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return resp
	}
	first := send()
	assert.Equal(t, http.StatusCreated, first.StatusCode)
	assert.Empty(t, first.Header.Get(core.ReplayedHeader))
	retry := send()
	assert.Equal(t, http.StatusCreated, retry.StatusCode)
	assert.Equal(t, []string{"true"}, retry.Header.Values("Idempotency-Replayed"), "the configured marker, and only it")
	assert.Empty(t, retry.Header.Get(core.ReplayedHeader), "Stripe's name is not sent as well")
	assert.Equal(t, int64(1), runs.Load())

	p := eng.Policy()
	assert.Equal(t, "Idempotency-Replayed", p.ReplayedHeader)
	assert.Equal(t, "Idempotency-Replayed", openapi.New(eng.Policy()).Extension["replayedHeader"])
}

// TestReplayedHeaderInvalid: a marker that is not a header token, is the
// key header, or is listed among the headers to replay is refused by New.
func TestReplayedHeaderInvalid(t *testing.T) {
	for name, opts := range map[string][]core.Option{
		"empty":         {core.WithReplayedHeader("")},
		"not a token":   {core.WithReplayedHeader("Idempotency Replayed")},
		"the key":       {core.WithReplayedHeader("idempotency-key")},
		"also replayed": {core.WithReplayedHeader("X-Replayed"), core.WithReplayHeaders("Content-Type", "x-replayed")},
	} {
		_, err := core.New(memstore.New(), append(opts, core.WithSharedKeySpace())...)
		assert.Error(t, err, name)
	}
}
