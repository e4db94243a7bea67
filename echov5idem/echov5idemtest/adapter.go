package echov5idemtest

import (
	"fmt"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v5"
	"github.com/labstack/echo/v5/middleware"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/echov5idem"
)

// Adapter serves the suite's routes the way an Echo v5 app would: each
// route with the idem middleware, the neutral handler mounted by
// echo.WrapHandler, on a real listener.
var Adapter = idemtest.Adapter{
	Name:         "echov5",
	FrameworkLog: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		var opts []echov5idem.Option
		if cfg.NilOptions {
			opts = append(opts, nil, echov5idem.WithScope(nil), echov5idem.WithSkip(nil), echov5idem.WithErrorHandler(nil))
		}
		if !cfg.NoScope {
			opts = append(opts, echov5idem.WithScope(func(c *echo.Context) (string, error) {
				if cfg.ScopeErr != nil {
					return "", cfg.ScopeErr
				}
				return c.Request().Header.Get(idemtest.ScopeHeader), nil
			}))
		}
		if cfg.SilentErrorHandler || cfg.ErrorHandlerSaw != nil {
			opts = append(opts, echov5idem.WithErrorHandler(func(c *echo.Context, err error, fallback *adapterkit.Response) error {
				if cfg.ErrorHandlerSaw != nil {
					cfg.ErrorHandlerSaw(err)
				}
				if !cfg.SilentErrorHandler {
					_ = adapterkit.WriteResponse(c.Response(), fallback)
				}
				return nil
			}))
		}
		mw, err := echov5idem.New(eng, opts...)
		if err != nil {
			return "", err
		}
		e := echo.New()
		if cfg.Log != nil {
			e.Logger = slog.New(slog.NewTextHandler(cfg.Log, nil))
			e.Use(middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
				LogStatus: true, LogMethod: true, LogURI: true,
				LogValuesFunc: func(_ *echo.Context, v middleware.RequestLoggerValues) error {
					_, err := fmt.Fprintf(cfg.Log, "%d %s %s error=%v\n", v.Status, v.Method, v.URI, v.Error)
					return err
				},
			}), middleware.Recover())
		}
		for _, rt := range routes {
			h := echo.WrapHandler(rt.Handler)
			if cfg.HandlerError != nil {
				h = func(c *echo.Context) error {
					rt.Handler.ServeHTTP(httptest.NewRecorder(), c.Request())
					return cfg.HandlerError
				}
			}
			e.Add(rt.Method, rt.Path, h, mw)
		}
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		return srv.URL, nil
	},
}
