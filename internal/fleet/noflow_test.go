package fleet

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// flowCall matches what only core may do: recover from a handler's panic,
// Commit or Abort a decision. gin's c.Abort() (ending gin's chain) is
// translation, not flow.
var flowCall = regexp.MustCompile(`\brecover\(\)|\bCommit\(|(^|[^c])\.Abort\(|\bAbort\(ctx`)

// TestAdaptersHoldNoFlow: the adapters' non-test code never recovers a
// panic, commits or aborts: the sequence around the handler is
// core.Engine.Serve's, in one place.
func TestAdaptersHoldNoFlow(t *testing.T) {
	for _, dir := range []string{"nethttpidem", "ginidem", "echoidem", "fiberidem"} {
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no sources (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for i, line := range strings.Split(string(src), "\n") {
				code, _, _ := strings.Cut(line, "//")
				if flowCall.MatchString(code) {
					t.Errorf("%s:%d holds flow: %s", f, i+1, strings.TrimSpace(line))
				}
			}
		}
	}
}
