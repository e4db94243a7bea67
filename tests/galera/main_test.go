package galera

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// EnvDSNs names the variable holding the three nodes' DSNs.
const EnvDSNs = "IDEM_TEST_GALERA_DSNS"

// formTimeout bounds the cluster's start-up (about 15-30 s on an idle
// 2-core machine; more while the rest of the suite runs).
const formTimeout = 4 * time.Minute

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	stop := func() {}
	if os.Getenv(EnvDSNs) == "" {
		var err error
		if stop, err = startCluster(); err != nil {
			fmt.Fprintln(os.Stderr, "galera:", err)
			return 1
		}
	}
	code := m.Run()
	stop() // before the leak check: its pipe reader ends with the script
	if code == 0 {
		// goleak retries for about a second; on a loaded machine the last
		// connections of the chaos run may take longer to wind down.
		err := goleak.Find()
		for i := 0; err != nil && i < 5; i++ {
			time.Sleep(time.Second)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "galera: leaked goroutines:", err)
			return 1
		}
	}
	return code
}

// startCluster runs scripts/galera.sh serve and waits for its DSN line. The
// script keeps the cluster up until its stdin closes: stop closes it and
// waits for the clean-up; if this process dies instead, the kernel closes
// it.
func startCluster() (stop func(), err error) {
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "galera.sh"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(script, "serve")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", script, err)
	}
	stop = func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), EnvDSNs+"="); ok {
				line <- v
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		close(line)
	}()
	select {
	case v, ok := <-line:
		if !ok || v == "" {
			stop()
			return nil, errors.New("scripts/galera.sh serve ended without starting the cluster (its messages are above)")
		}
		os.Setenv(EnvDSNs, v)
		return stop, nil
	case <-time.After(formTimeout):
		stop()
		return nil, fmt.Errorf("the cluster did not form within %v", formTimeout)
	}
}

// nodeDSNs returns the three nodes' DSNs; it fails t unless there are
// exactly three.
func nodeDSNs(t *testing.T) [3]string {
	t.Helper()
	v := os.Getenv(EnvDSNs)
	parts := strings.Split(v, ",")
	if len(parts) != 3 {
		t.Fatalf("%s=%q: want three comma-separated DSNs, one per node", EnvDSNs, v)
	}
	return [3]string{parts[0], parts[1], parts[2]}
}
