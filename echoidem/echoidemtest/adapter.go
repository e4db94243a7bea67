package echoidemtest

import (
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/echoidem"
)

// Adapter serves the suite's routes the way an Echo app would: each route
// with the idem middleware, the neutral handler mounted by
// echo.WrapHandler, on a real listener.
var Adapter = idemtest.Adapter{
	Name:         "echo",
	FrameworkLog: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		var opts []echoidem.Option
		if cfg.NilOptions {
			opts = append(opts, nil, echoidem.WithScope(nil), echoidem.WithSkip(nil), echoidem.WithErrorHandler(nil))
		}
		if !cfg.NoScope {
			opts = append(opts, echoidem.WithScope(func(c echo.Context) (string, error) {
				if cfg.ScopeErr != nil {
					return "", cfg.ScopeErr
				}
				return c.Request().Header.Get(idemtest.ScopeHeader), nil
			}))
		}
		if cfg.SilentErrorHandler || cfg.ErrorHandlerSaw != nil {
			opts = append(opts, echoidem.WithErrorHandler(func(c echo.Context, err error, fallback *adapterkit.Response) error {
				if cfg.ErrorHandlerSaw != nil {
					cfg.ErrorHandlerSaw(err)
				}
				if !cfg.SilentErrorHandler {
					_ = adapterkit.WriteResponse(c.Response(), fallback)
				}
				return nil
			}))
		}
		mw, err := echoidem.New(eng, opts...)
		if err != nil {
			return "", err
		}
		e := echo.New()
		e.HideBanner, e.HidePort = true, true
		if cfg.Log != nil {
			e.Logger.SetOutput(cfg.Log)
			e.Use(middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
				LogStatus: true, LogMethod: true, LogURI: true, LogError: true,
				LogValuesFunc: func(_ echo.Context, v middleware.RequestLoggerValues) error {
					_, err := fmt.Fprintf(cfg.Log, "%d %s %s error=%v\n", v.Status, v.Method, v.URI, v.Error)
					return err
				},
			}), middleware.Recover())
		}
		for _, rt := range routes {
			h := echo.WrapHandler(rt.Handler)
			if cfg.HandlerError != nil {
				h = func(c echo.Context) error {
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
