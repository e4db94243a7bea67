package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// versionJSON is what `idemctl version -json` prints.
type versionJSON struct {
	Version string            `json:"version"` // the module version idemctl was built from; "(devel)" from a checkout
	Go      string            `json:"go"`
	Modules map[string]string `json:"modules,omitempty"` // the idem modules linked in, and their versions
}

// buildInfo is debug.ReadBuildInfo, replaceable in tests.
var buildInfo = debug.ReadBuildInfo

// printVersion runs `idemctl version [-json]`: the version of the module
// idemctl was built from (what `go install ...@v0.x.y` stamps), and of each
// idem module linked in, which is what an operator compares with the
// service's.
func printVersion(stdout io.Writer, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("idemctl version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON, for scripts")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(stderr, "idemctl version: unexpected arguments")
		return exitUsage
	}
	v := versionJSON{Version: "unknown", Go: runtime.Version()}
	if bi, ok := buildInfo(); ok {
		v.Version = bi.Main.Version
		for _, d := range bi.Deps {
			if strings.HasPrefix(d.Path, "github.com/idemkit/idem") {
				if v.Modules == nil {
					v.Modules = map[string]string{}
				}
				v.Modules[d.Path] = d.Version
			}
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return exitFailure
		}
		return exitOK
	}
	fmt.Fprintf(stdout, "idemctl %s (%s)\n", v.Version, v.Go)
	for _, path := range sortedKeys(v.Modules) {
		fmt.Fprintf(stdout, "  %s %s\n", path, v.Modules[path])
	}
	return exitOK
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}
