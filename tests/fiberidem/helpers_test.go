package fiberidem_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
)

// serve runs app on a real listener on 127.0.0.1 and shuts it down (waiting
// for Listener to return) when the test ends.
func serve(t *testing.T, app *fiber.App) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = app.Listener(ln)
	}()
	t.Cleanup(func() {
		if err := app.ShutdownWithTimeout(10 * time.Second); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-done
	})
	return "http://" + ln.Addr().String()
}

func newApp(cfg ...fiber.Config) *fiber.App {
	c := fiber.Config{}
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.DisableStartupMessage = true
	app := fiber.New(c)
	quickStop(app)
	return app
}

// quickStop makes fasthttp's worker-pool cleaner, which only checks for
// shutdown between sleeps of MaxIdleWorkerDuration (default 10s), exit
// promptly after Shutdown, so that goleak sees it gone.
func quickStop(app *fiber.App) {
	app.Server().MaxIdleWorkerDuration = 50 * time.Millisecond
}

// client returns an HTTP client whose idle connections are closed when the
// test ends (goleak). maxConns > 0 limits it to that many connections, so
// that requests reuse one fasthttp connection (and its buffers).
func client(t *testing.T, maxConns int) *http.Client {
	tr := &http.Transport{MaxConnsPerHost: maxConns, MaxIdleConnsPerHost: 100, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

type result struct {
	Status int
	Header http.Header
	Body   string
}

// do sends one request; headers are name, value pairs. It never calls
// t.Fatal, so goroutines may use it.
func do(c *http.Client, method, url, body string, headers ...string) (result, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}, nil
}

func mustDo(t *testing.T, c *http.Client, method, url, body string, headers ...string) result {
	t.Helper()
	r, err := do(c, method, url, body, headers...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}
