package core_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/memstore"
)

// TestPolicyFollowsOptions: Engine.Policy reads back the options the engine
// was built with (core/openapi renders it).
func TestPolicyFollowsOptions(t *testing.T) {
	def := newEngine(t, memstore.New()).Policy()
	assert.Equal(t, "Idempotency-Key", def.Header)
	assert.True(t, def.KeyRequired)
	assert.Equal(t, []string{"PATCH", "POST"}, def.Methods)
	assert.Equal(t, 24*time.Hour, def.Retention)
	assert.Equal(t, 30*time.Second, def.Lease)
	assert.Equal(t, time.Duration(0), def.Wait)
	assert.True(t, def.Replayed(201))
	assert.True(t, def.Replayed(400))
	assert.False(t, def.Replayed(409))
	assert.False(t, def.Replayed(502))

	p := newEngine(t, memstore.New(),
		core.WithHeader("x-request-key"), core.WithKeyRequired(false), core.WithMethods("post", "put", "delete"),
		core.WithRetention(90*time.Minute), core.WithLease(10*time.Second), core.WithWait(2*time.Second),
		core.WithCanonicalJSON(true), core.WithFingerprintHeaders("accept"),
		core.WithRetryable(func(s int) bool { return s != 201 }),
	).Policy()
	assert.Equal(t, "X-Request-Key", p.Header)
	assert.False(t, p.KeyRequired)
	assert.Equal(t, []string{"DELETE", "POST", "PUT"}, p.Methods)
	assert.Equal(t, 90*time.Minute, p.Retention)
	assert.Equal(t, 10*time.Second, p.Lease)
	assert.Equal(t, 2*time.Second, p.Wait)
	assert.True(t, p.CanonicalJSON)
	assert.Equal(t, []string{"Accept"}, p.FingerprintHeaders)
	assert.True(t, p.Replayed(201))
	assert.False(t, p.Replayed(400))
}
