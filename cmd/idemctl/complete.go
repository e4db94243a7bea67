package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/completer"
	"github.com/idemkit/idem/core/storekit"
)

// completeFlags are complete's own flags.
type completeFlags struct {
	url    string
	header string
	after  time.Duration
	maxAge time.Duration
	limit  int
}

// complete makes one completer pass (core/completer) over st, sending each
// stalled execution's kept request to the service at f.url as the client's
// retry would: the service takes the record over and resumes from its
// steps.
func complete(ctx context.Context, st storekit.Admin, f completeFlags) (completer.Report, error) {
	s, ok := st.(core.Store)
	if !ok {
		return completer.Report{}, fmt.Errorf("complete: %T is not a store", st)
	}
	// The engine only names the key header and bounds the age; it serves
	// nothing. Its retention is just past -max-age so any age is accepted.
	eng, err := core.New(s, core.WithHeader(f.header), core.WithRetention(f.maxAge+time.Hour))
	if err != nil {
		return completer.Report{}, err
	}
	c, err := completer.New(eng, completer.Forward(&forwarder{base: strings.TrimSuffix(f.url, "/"),
		client: &http.Client{Timeout: time.Minute}}),
		completer.WithAfter(f.after), completer.WithMaxAge(f.maxAge), completer.WithLimit(f.limit))
	if err != nil {
		return completer.Report{}, err
	}
	return c.Once(ctx)
}

// forwarder sends a re-run to the service over HTTP and answers with the
// service's status and headers.
type forwarder struct {
	base   string
	client *http.Client
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req, err := http.NewRequestWithContext(r.Context(), r.Method, f.base+r.URL.RequestURI(), r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := f.client.Do(req)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
}

func validServiceURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

func (p *printer) completed(r completer.Report) int {
	if p.json {
		return p.emit(map[string]int{"finished": r.Finished, "failed": r.Failed, "abandoned": r.Abandoned})
	}
	fmt.Fprintf(p.w, "finished %d, failed %d, too old %d\n", r.Finished, r.Failed, r.Abandoned)
	return exitOK
}
