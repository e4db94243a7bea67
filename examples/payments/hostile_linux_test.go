package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Hostile input against the example as a process, on every framework
// (issue 36). Memory is the child's peak resident set (VmHWM), a size, not
// a time: the servers start at about 25 MiB.
const peakRSSLimit = 100 << 20

// peakRSS returns the process's peak resident set size in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// gzipOf compresses p at the best ratio.
func gzipOf(t *testing.T, p []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	require.NoError(t, err)
	_, err = zw.Write(p)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.Bytes()
}

// TestCompressedBomb: a payment request whose body, sent as
// "Content-Encoding: gzip, gzip", is a few KiB that inflate to 1 GiB, gets
// a client error and never a payment, and the server stays under 100 MiB.
// fiber's c.Body() inflated it without bound (726 MiB for a 200 MB body in
// the issue); the net/http servers do not decode request bodies at all.
func TestCompressedBomb(t *testing.T) {
	// 1,024 gzip members of 1 MiB of zeros (1 GiB once inflated), gzipped
	// again: the repeated members compress to almost nothing.
	inner := bytes.Repeat(gzipOf(t, make([]byte, 1<<20)), 1<<10)
	bomb := gzipOf(t, inner)
	require.Less(t, len(bomb), 1<<20, "within the request limit, so that idem reads it")
	bin := buildBinary(t)
	for _, fw := range frameworkNames() {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			p := startProcess(t, bin, nil, "-framework", fw, "-dsn", memDSN)
			user := "u-" + randomID()
			for i := range 3 {
				req, err := http.NewRequest(http.MethodPost, p.base+"/v1/payments", bytes.NewReader(bomb))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Content-Encoding", "gzip, gzip")
				req.Header.Set("X-User-ID", user)
				req.Header.Set("Idempotency-Key", "k-bomb-"+strconv.Itoa(i))
				resp, err := httpClient.Do(req)
				require.NoError(t, err)
				_, _ = io.Copy(io.Discard, resp.Body)
				require.NoError(t, resp.Body.Close())
				assert.True(t, resp.StatusCode >= 400 && resp.StatusCode < 500, "status %d, want a client error", resp.StatusCode)
			}
			list := mustDo(t, http.MethodGet, p.base+"/v1/payments", user, "", "")
			assert.NotContains(t, string(list.body), `"id"`, "a payment was made from the bomb")
			rss := peakRSS(t, p.pid)
			t.Logf("%s: peak RSS %d MiB after three %d KiB bodies that inflate to 1 GiB", fw, rss>>20, len(bomb)>>10)
			assert.Less(t, rss, int64(peakRSSLimit))
		})
	}
}

// TestSlowBodies: connections that declare a 4 MB body and send one byte a
// second neither take memory in proportion to what they declare (fasthttp
// sized its buffer from Content-Length: 2 GB for 500 of them) nor hold
// their connection beyond readTimeout (net/http never cut them); honest
// requests are served meanwhile.
func TestSlowBodies(t *testing.T) {
	const slow = 200
	bin := buildBinary(t)
	for _, fw := range frameworkNames() {
		t.Run(fw, func(t *testing.T) {
			t.Parallel()
			p := startProcess(t, bin, nil, "-framework", fw, "-dsn", memDSN)
			addr := strings.TrimPrefix(p.base, "http://")
			user := "u-" + randomID()
			start := time.Now()
			var (
				wg     sync.WaitGroup
				mu     sync.Mutex
				cutAt  []time.Duration
				opened = make(chan struct{}, slow)
			)
			for i := range slow {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cut, err := trickle(addr, user, "k-slow-"+strconv.Itoa(i), opened)
					if err != nil {
						t.Errorf("slow connection %d: %v", i, err)
						return
					}
					mu.Lock()
					cutAt = append(cutAt, cut.Sub(start))
					mu.Unlock()
				}()
			}
			for range slow {
				<-opened
			}
			// Honest payments while every slow connection is open.
			for i := range 10 {
				r := mustDo(t, http.MethodPost, p.base+"/v1/payments", user, "k-honest-"+strconv.Itoa(i), paymentBody(100+i))
				assert.Equal(t, http.StatusCreated, r.status, "honest request %d: %s", i, r.body)
			}
			wg.Wait()
			rss := peakRSS(t, p.pid)
			var last time.Duration
			for _, d := range cutAt {
				last = max(last, d)
			}
			t.Logf("%s: %d slow connections, all cut within %v; peak RSS %d MiB", fw, len(cutAt), last.Round(time.Millisecond), rss>>20)
			assert.Less(t, rss, int64(peakRSSLimit))
		})
	}
}

// trickle opens a connection, sends a payment request that declares a
// 4 MB body, and then one byte of it a second until the server closes the
// connection; it returns when it did. It gives up, with an error, after
// three times readTimeout.
func trickle(addr, user, key string, opened chan<- struct{}) (time.Time, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		opened <- struct{}{}
		return time.Time{}, err
	}
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST /v1/payments HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"X-User-ID: %s\r\nIdempotency-Key: %s\r\nContent-Length: 4000000\r\n\r\n{", addr, user, key)
	opened <- struct{}{}
	if err != nil {
		return time.Time{}, err
	}
	closed := make(chan time.Time, 1)
	go func() {
		// The server answers (408, 413, 400) and closes, or just closes.
		_, _ = io.Copy(io.Discard, bufio.NewReader(conn))
		closed <- time.Now()
	}()
	giveUp := time.After(3 * readTimeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case at := <-closed:
			return at, nil
		case <-giveUp:
			return time.Time{}, fmt.Errorf("still open after %v", 3*readTimeout)
		case <-tick.C:
			_, _ = conn.Write([]byte(" ")) // fails once the server has closed: the reader sees it
		}
	}
}
