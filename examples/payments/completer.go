package main

import (
	"net/http"

	"github.com/idemkit/idem/core/completer"
)

// newCompleter finishes payments whose owner died after the provider
// charge (a stored step) and whose client never came back: it sends the
// payment again through the net/http handler of the same service, which
// books the stored charge without calling the provider. The records are the
// same whatever -framework serves the API (tests/fleet), and net/http is the
// one handler every framework's process can build (fiber's adaptor does not
// carry the request's context).
func newCompleter(a *app, cfg config) (*completer.Completer, error) {
	h, err := netHTTPHandler(a)
	if err != nil {
		return nil, err
	}
	return completer.New(a.eng,
		completer.HTTP(http.MethodPost, "/v1/payments", h, userHeader),
		completer.WithInterval(cfg.completerEvery),
		completer.WithAfter(cfg.completerAfter))
}
