package leak

import (
	"strings"
	"testing"
	"time"
)

func TestFindSeesALeftGoroutine(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); leftRunning(stop) }()
	if got := Find(20 * time.Millisecond); !strings.Contains(got, "leftRunning") {
		t.Errorf("Find did not report the running goroutine; got %q", got)
	}
	close(stop)
	<-done
	if got := Find(2 * time.Second); got != "" {
		t.Errorf("Find reported goroutines after they ended:\n%s", got)
	}
}

func leftRunning(stop chan struct{}) { <-stop }
