package adapterkit

import "net/http"

// Response is a response as written by a handler, or as idem writes it.
type Response struct {
	Status int // 0 means the handler wrote nothing: 200, as net/http does
	Header http.Header
	// HeaderReader is read instead of Header when Header is nil (see
	// core.Request.HeaderReader): Commit asks it only for the allow-listed
	// headers (core.WithReplayHeaders).
	HeaderReader HeaderReader
	Body         []byte
	// Streamed: the handler flushed or hijacked; the response went out as it
	// was written and cannot be kept.
	Streamed bool
	// Truncated: the body exceeded the response limit; it went out whole but
	// cannot be kept.
	Truncated bool
}

// HeaderReader reads headers an adapter does not hold as an http.Header,
// by canonical name: every value of the header, in order, nil when absent.
// The strings must not alias memory the framework reuses: the engine and
// the store may keep them. http.Header implements it.
type HeaderReader interface {
	Values(name string) []string
}
