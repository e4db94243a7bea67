package ginidemtest

import (
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/adapterkit"
	"github.com/idemkit/idem/core/idemtest"
	"github.com/idemkit/idem/ginidem"
)

// Adapter mounts each idemtest route natively: the middleware, then the
// neutral handler through gin.WrapH, on a real listener.
var Adapter = idemtest.Adapter{
	Name:         "gin",
	FrameworkLog: true,
	ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
		var opts []ginidem.Option
		if cfg.NilOptions {
			opts = append(opts, nil, ginidem.WithScope(nil), ginidem.WithSkip(nil), ginidem.WithErrorHandler(nil))
		}
		if !cfg.NoScope {
			opts = append(opts, ginidem.WithScope(func(c *gin.Context) (string, error) {
				if cfg.ScopeErr != nil {
					return "", cfg.ScopeErr
				}
				return c.GetHeader(idemtest.ScopeHeader), nil
			}))
		}
		if cfg.SilentErrorHandler || cfg.ErrorHandlerSaw != nil {
			opts = append(opts, ginidem.WithErrorHandler(func(c *gin.Context, err error, fallback *adapterkit.Response) {
				if cfg.ErrorHandlerSaw != nil {
					cfg.ErrorHandlerSaw(err)
				}
				if !cfg.SilentErrorHandler {
					_ = adapterkit.WriteResponse(c.Writer, fallback)
				}
			}))
		}
		mw, err := ginidem.New(eng, opts...)
		if err != nil {
			return "", err
		}
		r := gin.New()
		if cfg.Log != nil {
			r.Use(gin.LoggerWithWriter(cfg.Log), gin.RecoveryWithWriter(cfg.Log))
		}
		for _, rt := range routes {
			h := gin.WrapH(rt.Handler)
			if cfg.HandlerError != nil {
				h = func(c *gin.Context) {
					rt.Handler.ServeHTTP(httptest.NewRecorder(), c.Request)
					_ = c.Error(cfg.HandlerError)
				}
			}
			r.Handle(rt.Method, rt.Path, mw, h)
		}
		srv := httptest.NewServer(r)
		t.Cleanup(srv.Close)
		return srv.URL, nil
	},
}
