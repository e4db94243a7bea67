package adapterkit

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// Recorder is the capturing http.ResponseWriter adapters wrap around the
// real one while a Proceed handler runs. It buffers the response so that
// Commit happens before the client sees it: a client never receives a
// success that was not recorded (in pgstore's transactional mode, one whose
// business writes were rolled back).
//
// A handler that flushes or hijacks, or writes more than the limit, switches
// the recorder to pass-through: bytes go straight out and the response is
// marked Streamed or Truncated, which Commit stores as "not retained".
//
// Header() is the recorder's own map: headers reach the client only with
// the handler's response, never with a problem written in its place.
type Recorder struct {
	w           http.ResponseWriter
	max         int
	header      http.Header
	status      int
	wroteHeader bool
	buf         bytes.Buffer
	passthrough bool
	streamed    bool
	truncated   bool
	snapshot    http.Header
	sent        bool
}

// NewRecorder wraps w, keeping up to maxBytes of body for replay. Headers
// outer middleware already set on w (Vary: Origin, X-Request-Id) start in
// the recorder's map, so the handler sees them and may change or delete
// them, as without idem; the recorder's map replaces w's only with the
// handler's response, never with a problem written in its place.
func NewRecorder(w http.ResponseWriter, maxBytes int) *Recorder {
	outer := w.Header()
	h := make(http.Header, len(outer)+2)
	for k, v := range outer {
		h[k] = append([]string(nil), v...)
	}
	return &Recorder{w: w, max: maxBytes, header: h}
}

// Header returns the header map the handler writes to.
func (r *Recorder) Header() http.Header { return r.header }

// WriteHeader records the status. Informational (1xx) statuses other than
// 101 go straight out, as net/http sends them.
func (r *Recorder) WriteHeader(code int) {
	if r.wroteHeader {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// net/http sends the map as it is with a 1xx and keeps it: put the
		// outer headers back after, so that a problem written instead of
		// the final response carries none of the handler's.
		out := r.w.Header()
		outer := out.Clone()
		copyHeader(out, r.header)
		r.w.WriteHeader(code)
		clear(out)
		copyHeader(out, outer)
		return
	}
	r.status = code
	r.wroteHeader = true
	r.snapshot = r.header.Clone()
	if r.passthrough {
		r.w.WriteHeader(code)
	}
}

// Write buffers p, or passes it through once streaming or over the limit.
func (r *Recorder) Write(p []byte) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if r.passthrough {
		return r.w.Write(p)
	}
	if r.buf.Len()+len(p) > r.max {
		r.truncated = true
		if err := r.startPassthrough(); err != nil {
			return 0, err
		}
		return r.w.Write(p)
	}
	return r.buf.Write(p)
}

// WriteString is Write for strings (io.StringWriter).
func (r *Recorder) WriteString(s string) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if r.passthrough || r.buf.Len()+len(s) > r.max {
		return r.Write([]byte(s))
	}
	return r.buf.WriteString(s)
}

// Flush sends what is buffered and streams from then on.
func (r *Recorder) Flush() { _ = r.FlushError() }

// FlushError is Flush reporting the error (http.ResponseController).
func (r *Recorder) FlushError() error {
	r.streamed = true
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	if err := r.startPassthrough(); err != nil {
		return err
	}
	return http.NewResponseController(r.w).Flush()
}

// Hijack hands the connection to the handler; the response is then
// streamed, never stored.
func (r *Recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(r.w).Hijack()
	if err == nil {
		r.streamed = true
		r.passthrough = true
		r.sent = true
	}
	return conn, rw, err
}

// Unwrap returns the wrapped writer (http.ResponseController).
func (r *Recorder) Unwrap() http.ResponseWriter { return r.w }

// Status returns the status written so far (0 if none).
func (r *Recorder) Status() int { return r.status }

// Size returns the number of body bytes buffered.
func (r *Recorder) Size() int { return r.buf.Len() }

// Written reports whether the handler wrote a status or body.
func (r *Recorder) Written() bool { return r.wroteHeader }

// Streaming reports whether the response already went out (flushed,
// hijacked or over the limit): it can no longer be replaced.
func (r *Recorder) Streaming() bool { return r.passthrough }

func (r *Recorder) startPassthrough() error {
	if r.passthrough {
		return nil
	}
	r.passthrough = true
	r.sent = true
	out := r.w.Header()
	snap := r.snapshotOrHeader()
	for k := range out {
		if _, ok := snap[k]; !ok {
			delete(out, k) // deleted by the handler
		}
	}
	copyHeader(out, snap)
	r.header = out // later header writes (trailers) go straight out
	r.w.WriteHeader(r.statusOr200())
	if r.buf.Len() > 0 {
		_, err := r.w.Write(r.buf.Bytes())
		r.buf.Reset()
		return err
	}
	return nil
}

func (r *Recorder) snapshotOrHeader() http.Header {
	if r.snapshot != nil {
		return r.snapshot
	}
	return r.header
}

func (r *Recorder) statusOr200() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// Result returns the response as captured, for Commit; Status is 0 when the
// handler wrote nothing. The body aliases the recorder's buffer; stores copy
// what they keep.
func (r *Recorder) Result() Response {
	return Response{
		Status:    r.status,
		Header:    r.snapshotOrHeader(),
		Body:      r.buf.Bytes(),
		Streamed:  r.streamed,
		Truncated: r.truncated,
	}
}

// Send writes the buffered response to the wrapped writer. It does nothing
// if the response already went out.
func (r *Recorder) Send() error {
	if r.sent {
		return nil
	}
	r.sent = true
	res := r.Result()
	// What the handler deleted from the headers it inherited stays deleted.
	out := r.w.Header()
	for k := range out {
		if _, ok := res.Header[k]; !ok {
			delete(out, k)
		}
	}
	if !r.hasTrailers() {
		return WriteResponse(r.w, &res)
	}
	// Trailers need a chunked body: no Content-Length (unless the handler
	// set one), and their values, which the handler set after the body,
	// copied after it too.
	copyHeader(r.w.Header(), res.Header)
	r.w.WriteHeader(r.statusOr200())
	var err error
	if len(res.Body) > 0 {
		_, err = r.w.Write(res.Body)
	}
	h := r.w.Header()
	for _, v := range res.Header["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			name = http.CanonicalHeaderKey(strings.TrimSpace(name))
			if vals, ok := r.header[name]; ok {
				h[name] = append([]string(nil), vals...)
			}
		}
	}
	for k, vals := range r.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			h[k] = append([]string(nil), vals...)
		}
	}
	return err
}

// hasTrailers reports whether the handler declared trailers (the Trailer
// header before WriteHeader) or set any under http.TrailerPrefix.
func (r *Recorder) hasTrailers() bool {
	if len(r.snapshotOrHeader()["Trailer"]) > 0 {
		return true
	}
	for k := range r.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// SendInstead writes resp in place of the handler's buffered response (when
// Commit failed). If the handler's response already went out, it does
// nothing and reports false.
func (r *Recorder) SendInstead(resp *Response) (bool, error) {
	if r.sent {
		return false, nil
	}
	r.sent = true
	return true, WriteResponse(r.w, resp)
}

// WriteResponse writes resp to w: its headers (replacing any of the same
// name), Content-Length, status and body.
func WriteResponse(w http.ResponseWriter, resp *Response) error {
	h := w.Header()
	copyHeader(h, resp.Header)
	status := resp.Status
	if status == 0 {
		status = http.StatusOK
	}
	if bodyAllowed(status) {
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(status)
	if len(resp.Body) == 0 {
		return nil
	}
	_, err := w.Write(resp.Body)
	return err
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

func copyHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = append([]string(nil), v...)
	}
}
