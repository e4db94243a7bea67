package calltest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
)

// Environment of a child process.
const (
	envRole = "IDEM_CALLTEST_ROLE"   // "dup" or "owner"
	envFile = "IDEM_CALLTEST_EFFECT" // the file effects are appended to
)

const (
	procs      = 3 // duplicate processes
	procKeys   = 4 // keys each of them calls
	procCopies = 3 // goroutines per key per process
	outPrefix  = "calltest-out "
)

// Processes runs the cross-process suite: duplicates of one call from
// several processes run it once, and a call whose owner is SIGKILLed
// mid-call is taken over by another process once the lease lapses,
// sending the provider the same relay key. The children re-run the
// calling test, so Processes must be called from a top-level test
// function with no work before it that a child must not repeat; open
// builds the store in the parent and in each child on the same database,
// and env is what the children need to find it (the parent's environment
// is passed down too).
func Processes(t *testing.T, open NewStore, env ...string) {
	if role := os.Getenv(envRole); role != "" {
		child(t, role, open(t), os.Getenv(envFile))
		return
	}
	s := open(t)
	t.Run("Duplicates", func(t *testing.T) { duplicatesAcrossProcesses(t, env) })
	t.Run("TakeoverAfterSIGKILL", func(t *testing.T) { takeoverAfterKill(t, s, env) })
}

// spawn starts the test binary as a child playing role; closing its
// stdin starts a "dup" child's calls.
func spawn(t *testing.T, top, role, effects string, env []string) (*exec.Cmd, io.Reader, io.WriteCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+top+"$", "-test.count=1", "-test.timeout=120s")
	cmd.Env = append(append(os.Environ(), env...), envRole+"="+role, envFile+"="+effects)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	return cmd, out, in
}

func topName(t *testing.T) string { return strings.SplitN(t.Name(), "/", 2)[0] }

func duplicatesAcrossProcesses(t *testing.T, env []string) {
	effects := t.TempDir() + "/effects"
	type child struct {
		cmd   *exec.Cmd
		start io.WriteCloser
		out   []string
		ready chan struct{}
		done  chan struct{}
	}
	var children []*child
	for range procs {
		cmd, out, in := spawn(t, topName(t), "dup", effects, env)
		c := &child{cmd: cmd, start: in, ready: make(chan struct{}), done: make(chan struct{})}
		go func() {
			defer close(c.done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == outPrefix+"ready" {
					close(c.ready)
				} else if line, ok := strings.CutPrefix(sc.Text(), outPrefix); ok {
					c.out = append(c.out, line)
				}
			}
		}()
		children = append(children, c)
	}
	// Every child has its store open before any calls: their calls overlap.
	for i, c := range children {
		select {
		case <-c.ready:
		case <-c.done:
			t.Fatalf("child %d ended before it was ready", i)
		}
	}
	for _, c := range children {
		_ = c.start.Close()
	}
	results := map[string]map[string]int{}
	for i, c := range children {
		<-c.done
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child %d: %v", i, err)
		}
		for _, line := range c.out {
			key, val, _ := strings.Cut(line, " ")
			if results[key] == nil {
				results[key] = map[string]int{}
			}
			results[key][val]++
		}
	}
	runs := effectCounts(t, effects)
	for k := range procKeys {
		key := "xdup-" + strconv.Itoa(k)
		if runs[key] != 1 {
			t.Errorf("%s ran %d times across %d processes, want 1", key, runs[key], procs)
		}
		if len(results[key]) != 1 {
			t.Errorf("%s: callers saw %d different results (%v), want 1", key, len(results[key]), results[key])
		}
		n := 0
		for _, c := range results[key] {
			n += c
		}
		if n != procs*procCopies {
			t.Errorf("%s: %d callers answered, want %d", key, n, procs*procCopies)
		}
	}
}

func takeoverAfterKill(t *testing.T, s core.Store, env []string) {
	effects := t.TempDir() + "/effects"
	cmd, out, _ := spawn(t, topName(t), "owner", effects, env)
	started := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == outPrefix+"started" {
				started <- true
				break
			}
		}
		_, _ = io.Copy(io.Discard, out)
		close(started)
	}()
	if !<-started {
		_ = cmd.Wait()
		t.Fatal("the owner child ended before its call started")
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup, no release
		t.Fatal(err)
	}
	_ = cmd.Wait()

	e := engine(t, s, core.WithLease(5*time.Second), core.WithWait(20*time.Second))
	r, err := e.Call(ctx(t), req("xkill", "1"), func(ctx context.Context) ([]byte, error) {
		appendEffect(t, effects, "relay "+core.RelayKey(ctx, "provider"))
		return []byte("taken over"), nil
	})
	if err != nil || r.Replayed || string(r.Value) != "taken over" {
		t.Fatalf("takeover = %+v, %v; want a fresh run once the killed owner's lease lapsed", r, err)
	}
	lines := readLines(t, effects)
	if len(lines) != 2 || lines[0] != lines[1] {
		t.Fatalf("effects %q: want the killed owner's and the taker's, with one relay key", lines)
	}
	r, err = e.Call(ctx(t), req("xkill", "1"), func(context.Context) ([]byte, error) {
		return nil, errors.New("ran a third time")
	})
	if err != nil || !r.Replayed || string(r.Value) != "taken over" {
		t.Fatalf("retry after takeover = %+v, %v; want the replay", r, err)
	}
}

// child plays role in a child process, printing its results on stdout.
func child(t *testing.T, role string, s core.Store, effects string) {
	switch role {
	case "dup":
		e := engine(t, s, core.WithWait(60*time.Second))
		fmt.Printf("%sready\n", outPrefix)
		_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes it: all children start together
		var wg sync.WaitGroup
		var mu sync.Mutex
		for k := range procKeys {
			key := "xdup-" + strconv.Itoa(k)
			for range procCopies {
				wg.Go(func() {
					r, err := e.Call(ctx(t), req(key, "in"), func(context.Context) ([]byte, error) {
						appendEffect(t, effects, key)
						return []byte(key + "@" + strconv.Itoa(os.Getpid())), nil
					})
					if err != nil {
						t.Errorf("%s: %v", key, err)
						return
					}
					mu.Lock()
					fmt.Printf("%s%s %s\n", outPrefix, key, r.Value)
					mu.Unlock()
				})
			}
		}
		wg.Wait()
	case "owner":
		e := engine(t, s, core.WithLease(time.Second))
		_, err := e.Call(ctx(t), req("xkill", "1"), func(ctx context.Context) ([]byte, error) {
			appendEffect(t, effects, "relay "+core.RelayKey(ctx, "provider"))
			fmt.Printf("%sstarted\n", outPrefix)
			<-ctx.Done() // until SIGKILL
			return nil, ctx.Err()
		})
		t.Errorf("the owner's call returned (%v); it should have been killed", err)
	default:
		t.Fatalf("unknown role %q", role)
	}
}

// appendEffect records one effect: O_APPEND writes of a line are atomic
// across processes, and a SIGKILL does not lose what the kernel has.
func appendEffect(t testing.TB, path, line string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Errorf("effects: %v", err)
		return
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Errorf("effects: %v", err)
	}
}

func readLines(t testing.TB, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(b), "relay ", "relay:"))
}

func effectCounts(t testing.TB, path string) map[string]int {
	n := map[string]int{}
	for _, l := range readLines(t, path) {
		n[l]++
	}
	return n
}
