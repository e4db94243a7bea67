// Package idemtest is the conformance suite every idem adapter runs: the
// same HTTP scenarios, over real connections, against net/http, gin, echo,
// fiber, or any new framework.
//
// An adapter author describes how to serve a list of routes through the
// adapter's middleware, with the variations a Config asks for, then calls
// Run with a store constructor:
//
//	func TestConformance(t *testing.T) {
//		idemtest.Run(t, idemtest.Adapter{
//			Name: "gin",
//			ServeConfig: func(t *testing.T, eng *core.Engine, routes []idemtest.Route, cfg idemtest.Config) (string, error) {
//				var opts []ginidem.Option
//				if !cfg.NoScope {
//					opts = append(opts, ginidem.WithScope(func(c *gin.Context) (string, error) {
//						if cfg.ScopeErr != nil {
//							return "", cfg.ScopeErr
//						}
//						return c.GetHeader(idemtest.ScopeHeader), nil
//					}))
//				}
//				// ... cfg.NilOptions, cfg.SilentErrorHandler, cfg.ErrorHandlerSaw, cfg.HandlerError
//				mw, err := ginidem.New(eng, opts...)
//				if err != nil {
//					return "", err // the constructor's refusal is part of the contract
//				}
//				r := gin.New()
//				for _, rt := range routes {
//					r.Handle(rt.Method, rt.Path, mw, gin.WrapH(rt.Handler))
//				}
//				srv := httptest.NewServer(r)
//				t.Cleanup(srv.Close)
//				return srv.URL, nil
//			},
//		}, func(t *testing.T) core.Store { return memstore.New() })
//	}
//
// The cross-adapter scenarios pin what every adapter shares because the flow
// is core's: an adapter without a scope function cannot be built (unless
// the engine has core.WithSharedKeySpace), a scope error answers 401 and is
// logged, a silent error handler still yields the problem response, a
// failed commit answers 503 instead of the handler's response, a handler
// error goes through the outcome policy (never a 2xx, retryable), nil
// options are harmless, Retry-After follows core.WithRetryAfter, and the
// sentinel keys (SentinelKeys: 1 and 255 bytes, quotes, backslashes,
// non-ASCII) sent down every error path (store errors, panics, scope and
// handler errors) never appear, in any escaped form (KeyLeaks), in a log
// line, an event's error, an error handler's error, a response, or the
// framework's own logger and panic recovery (Config.Log; set
// Adapter.FrameworkLog when ServeConfig mounts them).
//
// Requirements on ServeConfig (and Serve, its older form without Config):
//   - It serves every route (method and path exactly as given; paths have
//     no parameters) through the adapter's idem middleware built on eng, on
//     a real listener on 127.0.0.1, and returns the base URL
//     ("http://127.0.0.1:port").
//   - The adapter's scope option returns the value of the request header
//     ScopeHeader ("X-Tenant") verbatim: the suite reads records back from
//     the store under that scope.
//   - The route handler's r.Context() carries the lease, so that
//     core.KeyFromContext and core.RelayKey work in the handler. (fiber's
//     adaptor.HTTPHandler builds the *http.Request from the fasthttp
//     context and drops c.UserContext(); mount the handler with a small
//     wrapper that calls r.WithContext(c.UserContext()) instead.)
//   - It registers shutdown with t.Cleanup. Route handlers that block are
//     released before the server's cleanup runs, and never block for more
//     than 15 seconds anyway, so a server that waits for active requests
//     on Close does not hang the suite.
//
// Each scenario is a sub-test with a stable name (see Run), builds its own
// engine with the options it needs (core.WithWait, core.WithLease,
// core.WithMaxRequestBytes, ...) on a fresh store from newStore, and calls
// Serve once. Keys and tenants are unique per run, so a store constructor
// may share one database across scenarios. Scenarios run sequentially; a
// few exercise real concurrency (up to 100 simultaneous requests) and take
// a fraction of a second. Every wait is bounded: a broken adapter fails the
// scenario rather than hanging it.
//
// Run with -run to pick scenarios, e.g.
//
//	go test -race -run 'TestConformance/concurrent' ./ginidem
package idemtest
