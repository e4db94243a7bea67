package fiberv3idemtest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/adaptor"
	"github.com/gofiber/fiber/v3/middleware/logger"
	"github.com/gofiber/fiber/v3/middleware/recover"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/fiberv3idem"
)

// Adapter serves the suite's routes the way a Fiber v3 app would: each
// route with the idem handler in front, on a real listener (NewApp, Serve).
var Adapter = idemtest.Adapter{
	Name:         "fiberv3",
	FrameworkLog: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		var opts []fiberv3idem.Option
		if cfg.NilOptions {
			opts = append(opts, nil, fiberv3idem.WithScope(nil), fiberv3idem.WithSkip(nil),
				fiberv3idem.WithRoute(nil), fiberv3idem.WithErrorHandler(nil))
		}
		if !cfg.NoScope {
			opts = append(opts, fiberv3idem.WithScope(func(c fiber.Ctx) (string, error) {
				if cfg.ScopeErr != nil {
					return "", cfg.ScopeErr
				}
				return c.Get(idemtest.ScopeHeader), nil
			}))
		}
		if cfg.SilentErrorHandler || cfg.ErrorHandlerSaw != nil {
			opts = append(opts, fiberv3idem.WithErrorHandler(func(c fiber.Ctx, err error, fallback *adapterkit.Response) error {
				if cfg.ErrorHandlerSaw != nil {
					cfg.ErrorHandlerSaw(err)
				}
				if !cfg.SilentErrorHandler {
					c.Status(fallback.Status)
					for k, v := range fallback.Header {
						c.Set(k, v[0])
					}
					return c.Send(fallback.Body)
				}
				return nil
			}))
		}
		mw, err := fiberv3idem.New(eng, opts...)
		if err != nil {
			return "", err
		}
		app := NewApp()
		if cfg.Log != nil {
			// No ${time} in the format: it starts a goroutine that never ends.
			app.Use(logger.New(logger.Config{Stream: cfg.Log, Format: "${status} | ${method} | ${path} | ${error}\n"}), recover.New(recover.Config{
				EnableStackTrace: true,
				StackTraceHandler: func(_ fiber.Ctx, p any) {
					_, _ = fmt.Fprintf(cfg.Log, "panic: %v\n", p)
				},
			}))
		}
		for _, rt := range routes {
			h := httpHandler(rt.Handler)
			if cfg.HandlerError != nil {
				h = func(c fiber.Ctx) error {
					if r, err := adaptor.ConvertRequest(c, true); err == nil {
						rt.Handler.ServeHTTP(httptest.NewRecorder(), r.WithContext(c.Context()))
					}
					return cfg.HandlerError
				}
			}
			app.Add([]string{rt.Method}, rt.Path, mw, h)
		}
		return Serve(t, app), nil
	},
}

// httpHandler mounts a net/http handler like adaptor.HTTPHandler, but with
// c.Context() (which carries idem's lease) as the request context.
func httpHandler(h http.Handler) fiber.Handler {
	return func(c fiber.Ctx) error {
		r, err := adaptor.ConvertRequest(c, true)
		if err != nil {
			return err
		}
		w := &responseWriter{c: c, header: make(http.Header)}
		h.ServeHTTP(w, r.WithContext(c.Context()))
		w.finish()
		return nil
	}
}

// responseWriter writes a net/http handler's response into the fiber
// response.
type responseWriter struct {
	c           fiber.Ctx
	header      http.Header
	wroteHeader bool
}

func (w *responseWriter) Header() http.Header { return w.header }

func (w *responseWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	w.wroteHeader = true
	for k, vs := range w.header {
		for i, v := range vs {
			if i == 0 {
				w.c.Set(k, v)
			} else {
				w.c.Response().Header.Add(k, v)
			}
		}
	}
	w.c.Status(code)
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		if w.header.Get("Content-Type") == "" && len(p) > 0 {
			w.header.Set("Content-Type", http.DetectContentType(p))
		}
		w.WriteHeader(http.StatusOK)
	}
	w.c.Response().AppendBody(p) // copies p
	return len(p), nil
}

func (w *responseWriter) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
}
