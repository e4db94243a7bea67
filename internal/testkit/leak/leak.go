// Package leak fails a test binary whose tests leave goroutines running: goleak.VerifyTestMain
// for the root module, which depends on the standard library only (see internal/testkit).
package leak

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// VerifyTestMain runs the tests and, when they pass, fails the binary if goroutines other than
// the runtime's and the testing package's are still alive after a grace period (goroutines
// that are ending get up to about two seconds).
func VerifyTestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := Find(2 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leak: found unexpected goroutines:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// Find waits up to grace for the goroutines started by the tests to end and returns the stacks
// of those still running ("" when none are).
func Find(grace time.Duration) string {
	deadline := time.Now().Add(grace)
	for d := time.Microsecond; ; d = min(2*d, 100*time.Millisecond) {
		leaked := others()
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(d)
	}
}

// others returns the stacks of every goroutine but the caller's and the background ones the
// runtime, os/signal and testing run.
func others() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := strings.Split(string(buf), "\n\n")
	var out []string
	for i, s := range stacks {
		if i == 0 || background(s) { // the first stack is the caller's own
			continue
		}
		out = append(out, s)
	}
	return out
}

func background(stack string) bool {
	lines := strings.Split(strings.TrimSpace(stack), "\n")
	if len(lines) < 2 {
		return true
	}
	state := ""
	if i, j := strings.Index(lines[0], "["), strings.Index(lines[0], "]"); i >= 0 && j > i {
		state = lines[0][i+1 : j]
	}
	top := lines[1]
	if k := strings.LastIndex(top, "("); k > 0 {
		top = top[:k]
	}
	switch top {
	case "testing.RunTests", "testing.(*T).Run", "testing.(*T).Parallel", "testing.runFuzzing", "testing.runFuzzTests":
		return strings.HasPrefix(state, "chan receive")
	case "os/signal.signal_recv", "os/signal.loop":
		return true
	}
	if strings.Contains(stack, "runtime.ensureSigM") {
		return true
	}
	return strings.Contains(stack, "runtime.goexit") && strings.HasPrefix(state, "syscall")
}
