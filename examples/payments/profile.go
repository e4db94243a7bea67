package main

import (
	"expvar"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"runtime/metrics"
	rpprof "runtime/pprof"
	"sync"
	"time"
)

// startCPUProfile starts a pprof CPU profile written to path (-cpuprofile);
// stop ends it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := rpprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		rpprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// serveDebugVars serves expvar's /debug/vars, with the number of
// goroutines and the live heap, on its own listener at addr (make soak samples it); the
// address is logged. It returns the function that stops it.
func serveDebugVars(addr string, log *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	goroutines.Do(func() {
		expvar.Publish("goroutines", expvar.Func(func() any { return runtime.NumGoroutine() }))
		// The heap the last GC found live: steadier than memstats'
		// HeapAlloc, which includes garbage not yet collected.
		expvar.Publish("heap_live", expvar.Func(func() any {
			s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
			metrics.Read(s)
			return s[0].Value.Uint64()
		}))
	})
	mux := http.NewServeMux()
	mux.Handle("GET /debug/vars", expvar.Handler())
	mux.HandleFunc("GET /debug/pprof/", pprof.Index) // heap, goroutine, ... profiles of a soak
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	log.Info("debug vars", "addr", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}

// goroutines publishes the expvar once per process (tests run several).
var goroutines sync.Once
