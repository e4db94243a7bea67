package idemtest

import (
	"bytes"
	"sync"
)

// LogBuffer is a concurrency-safe io.Writer for capturing an engine's slog
// output (core.WithLogger(slog.New(slog.NewJSONHandler(buf, nil)))) while
// handlers and heartbeats log from several goroutines; tests then assert on
// String(), e.g. that no idempotency key appears in clear.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
