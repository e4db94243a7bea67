package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"
)

// dbRelay is -db-rtt: a TCP relay on 127.0.0.1 between every server and
// the database that holds each chunk, in each direction, for half the
// added round-trip time before passing it on, in order. Pipelined traffic
// stays pipelined (a chunk's delay does not wait for the one before it to
// be written), so a server pays the added time once per round trip, as on
// a network, and not per message. Loopback costs no time per round trip;
// a database in another zone or behind a proxy does, and this is where a
// design's round trips per request show.
type dbRelay struct {
	ln       net.Listener
	upstream string
	oneWay   time.Duration

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startDBRelay listens on 127.0.0.1 and relays to upstream (host:port).
func startDBRelay(upstream string, rtt time.Duration) (*dbRelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("db relay: %w", err)
	}
	r := &dbRelay{ln: ln, upstream: upstream, oneWay: rtt / 2, conns: map[net.Conn]struct{}{}}
	r.wg.Go(r.accept)
	return r, nil
}

func (r *dbRelay) addr() string { return r.ln.Addr().String() }

// close stops accepting, closes every relayed connection and waits for the
// relay's goroutines. A nil conns map marks the relay closed.
func (r *dbRelay) close() {
	r.mu.Lock()
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	_ = r.ln.Close()
	for c := range conns {
		_ = c.Close()
	}
	r.wg.Wait()
}

func (r *dbRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *dbRelay) accept() {
	for {
		down, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", r.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		if !r.track(down) || !r.track(up) {
			_ = down.Close()
			_ = up.Close()
			return
		}
		r.wg.Go(func() { r.pipe(up, down) })
		r.wg.Go(func() { r.pipe(down, up) })
	}
}

// pipe copies src to dst, each chunk written oneWay after it was read.
func (r *dbRelay) pipe(dst, src net.Conn) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	ch := make(chan chunk, 256)
	var reader sync.WaitGroup
	reader.Go(func() {
		defer close(ch)
		// One read buffer, each chunk a copy of what was read: a chunk is
		// a few hundred bytes, and a fresh 32 KiB buffer per read made the
		// relay's garbage collection take CPU the servers compete for.
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{bytes.Clone(buf[:n]), time.Now().Add(r.oneWay)}
			}
			if err != nil {
				return
			}
		}
	})
	for c := range ch {
		if d := time.Until(c.at); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	// Either side gone: end both, so the other direction stops too.
	_ = src.Close()
	_ = dst.Close()
	for range ch { // unblock the reader
	}
	reader.Wait()
	r.mu.Lock()
	if r.conns != nil {
		delete(r.conns, src)
		delete(r.conns, dst)
	}
	r.mu.Unlock()
}

// dsnUpstream returns the host:port a URL-form DSN (postgres://, mysql://)
// connects to.
func dsnUpstream(dsn string) (string, error) {
	u, err := urlDSN(dsn)
	if err != nil {
		return "", err
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = "5432"
		if isMySQL(dsn) {
			port = "3306"
		}
	}
	return net.JoinHostPort(host, port), nil
}

// viaRelay returns dsn pointed at the relay's address.
func viaRelay(dsn, addr string) (string, error) {
	u, err := urlDSN(dsn)
	if err != nil {
		return "", err
	}
	u.Host = addr
	return u.String(), nil
}

func urlDSN(dsn string) (*url.URL, error) {
	if !strings.Contains(dsn, "://") {
		return nil, errors.New("-db-rtt needs a URL-form -dsn (postgres://… or mysql://…)")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("-dsn: %w", err)
	}
	if u.Host == "" || strings.Contains(u.Host, ",") {
		return nil, errors.New("-db-rtt needs a -dsn with one host:port")
	}
	return u, nil
}
