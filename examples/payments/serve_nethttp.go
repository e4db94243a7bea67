package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/idemkit/idem/nethttpidem"
)

// serveNetHTTP mounts the service on http.ServeMux with nethttpidem.
func serveNetHTTP(ctx context.Context, ln net.Listener, a *app) error {
	h, err := netHTTPHandler(a)
	if err != nil {
		return err
	}
	return serveHTTP(ctx, ln, h, a.log)
}

func netHTTPHandler(a *app) (http.Handler, error) {
	idem, err := nethttpidem.New(a.eng, nethttpidem.WithScope(func(r *http.Request) (string, error) {
		if u := r.Header.Get(userHeader); u != "" {
			return u, nil
		}
		return "", errors.New("no user")
	}))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", requireUser(idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			status, out := problemJSON(http.StatusBadRequest, "unreadable-body", "Unreadable body", err.Error())
			writeNetHTTP(w, status, out)
			return
		}
		status, out := a.svc.CreatePayment(r.Context(), r.Header.Get(userHeader), body)
		writeNetHTTP(w, status, out)
	}))))
	mux.Handle("GET /v1/payments", requireUser(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, out := a.svc.ListPayments(r.Context(), r.Header.Get(userHeader))
		writeNetHTTP(w, status, out)
	})))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeNetHTTP(w, http.StatusOK, healthBody())
	})
	if a.metrics != nil {
		mux.Handle("GET /metrics", a.metrics)
	}
	mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		writeNetHTTP(w, http.StatusOK, a.openapi)
	})
	return mux, nil
}

// requireUser answers 401 to a request without X-User-ID, before idem.
func requireUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(userHeader) == "" {
			status, out := unauthorized()
			writeNetHTTP(w, status, out)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeNetHTTP(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", contentType(status))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
