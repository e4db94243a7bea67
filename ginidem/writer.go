package ginidem

import (
	"bufio"
	"errors"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core/adapterkit"
)

// notWritten is gin's size before the header is committed.
const notWritten = -1

var errHijackAfterWrite = errors.New("ginidem: response body already written")

// writer is the gin.ResponseWriter installed as c.Writer while a protected
// chain runs. It keeps gin's lazy-header semantics (WriteHeader only records
// the status; the header is committed by WriteHeaderNow or the first Write,
// so headers set after c.Status still go out) and sends the committed status
// and body into a adapterkit.Recorder, which buffers them until the outcome is
// stored. The embedded gin.ResponseWriter is the original writer; only
// CloseNotify and Pusher reach it directly.
type writer struct {
	gin.ResponseWriter
	rec       *adapterkit.Recorder
	status    int  // pending status, gin's default 200 (or 404/405 preset by gin)
	statusSet bool // WriteHeader was called by the chain
	size      int  // body bytes written; notWritten until the header is committed
}

var _ gin.ResponseWriter = (*writer)(nil)

func newWriter(orig gin.ResponseWriter, rec *adapterkit.Recorder) *writer {
	return &writer{ResponseWriter: orig, rec: rec, status: orig.Status(), size: notWritten}
}

// Header returns the recorder's header map: headers reach the client only
// with the handler's response, never with a problem written in its place.
func (w *writer) Header() http.Header { return w.rec.Header() }

// WriteHeader records the status, as gin's writer does; it is ignored once
// the header is committed.
func (w *writer) WriteHeader(code int) {
	if code <= 0 || w.Written() {
		return
	}
	w.status = code
	w.statusSet = true
}

// WriteHeaderNow commits the pending status to the recorder.
func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.rec.WriteHeader(w.status)
	}
}

func (w *writer) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.rec.Write(p)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) {
	w.WriteHeaderNow()
	n, err := w.rec.WriteString(s)
	w.size += n
	return n, err
}

// Status returns the pending or committed status (200 until set, as gin).
func (w *writer) Status() int { return w.status }

// Size returns the body bytes written, -1 before the header is committed.
func (w *writer) Size() int { return w.size }

// Written reports whether the header was committed.
func (w *writer) Written() bool { return w.size != notWritten }

// Flush sends the response so far and streams from then on: the response
// is then not retained for replay.
func (w *writer) Flush() {
	w.WriteHeaderNow()
	w.rec.Flush()
}

// Hijack hands the connection over (websockets); the response is then not
// retained for replay. Like gin, it refuses once body bytes were written.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size > 0 {
		return nil, nil, errHijackAfterWrite
	}
	if w.size < 0 {
		w.size = 0
	}
	return w.rec.Hijack()
}

// Unwrap returns the recorder, for http.ResponseController.
func (w *writer) Unwrap() http.ResponseWriter { return w.rec }
