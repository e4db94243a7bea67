// Command modproxy lays Go modules out as a module proxy in a directory, in
// the form a published tag has: <path>/@v/list, VERSION.info, VERSION.mod and
// VERSION.zip (served with GOPROXY=file://DIR). scripts/release-check.sh uses
// it to build consumers against a release before the release is tagged.
//
//	modproxy -proxy DIR -version V [-release] MODDIR...
//
// With -release, each module is first edited in place as the release commit
// edits it: every requirement on another of the named modules is set to V, the
// local replace of it dropped (a replace in a dependency's go.mod is ignored
// by its consumers, so only the requirement's version counts), and that
// module's hashes at V added to go.sum. A module is packed after the modules
// it requires, whose zips its go.sum hashes.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	"golang.org/x/mod/zip"
)

func main() {
	proxy := flag.String("proxy", "", "proxy directory to write")
	version := flag.String("version", "", "the version to publish the modules at")
	release := flag.Bool("release", false, "first edit each module as the release commit does: requirements on the named modules at -version, their replaces dropped, their hashes in go.sum")
	flag.Parse()
	if *proxy == "" || !semver.IsValid(*version) || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: modproxy -proxy DIR -version vX.Y.Z [-release] MODDIR...")
		os.Exit(2)
	}
	if err := run(*proxy, *version, *release, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

type mod struct {
	dir  string
	file *modfile.File
}

func (m mod) path() string { return m.file.Module.Mod.Path }

func run(proxy, version string, release bool, dirs []string) error {
	var todo []mod
	for _, dir := range dirs {
		name := filepath.Join(dir, "go.mod")
		data, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			return err
		}
		if f.Module == nil {
			return fmt.Errorf("%s: no module directive", name)
		}
		todo = append(todo, mod{dir, f})
	}
	paths := map[string]bool{}
	for _, m := range todo {
		paths[m.path()] = true
	}
	sums := map[string][]string{} // the go.sum lines of each module packed so far
	waits := func(m mod) bool {   // on a module it requires
		return slices.ContainsFunc(m.file.Require, func(r *modfile.Require) bool {
			return paths[r.Mod.Path] && sums[r.Mod.Path] == nil
		})
	}
	for len(todo) > 0 {
		var next []mod
		for _, m := range todo {
			if release {
				if waits(m) {
					next = append(next, m)
					continue
				}
				if err := edit(m, paths, version, sums); err != nil {
					return err
				}
			}
			lines, err := publish(proxy, m, version)
			if err != nil {
				return err
			}
			sums[m.path()] = lines
		}
		if len(next) == len(todo) {
			return fmt.Errorf("%s: the modules require each other in a cycle", next[0].dir)
		}
		todo = next
	}
	return nil
}

// edit rewrites m's go.mod and go.sum as the release commit does:
// requirements on the other modules at version, their replaces gone, their
// hashes (sums) in go.sum.
func edit(m mod, paths map[string]bool, version string, sums map[string][]string) error {
	f := m.file
	for _, r := range slices.Clone(f.Replace) {
		if paths[r.Old.Path] {
			if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	var add []string
	for _, r := range f.Require {
		if paths[r.Mod.Path] {
			if err := f.AddRequire(r.Mod.Path, version); err != nil {
				return err
			}
			add = append(add, sums[r.Mod.Path]...)
		}
	}
	f.Cleanup()
	data, err := f.Format()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(m.dir, "go.mod"), data, 0o644); err != nil {
		return err
	}
	goSum := filepath.Join(m.dir, "go.sum")
	old, err := os.ReadFile(goSum)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	lines := append(strings.Split(strings.TrimSpace(string(old)), "\n"), add...)
	slices.Sort(lines)
	lines = slices.Compact(lines)
	if lines[0] == "" {
		lines = lines[1:]
	}
	return os.WriteFile(goSum, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// publish writes m at version into proxy, as the module proxy protocol lays
// it out (https://go.dev/ref/mod#goproxy-protocol), and returns the go.sum
// lines of what it wrote.
func publish(proxy string, m mod, version string) ([]string, error) {
	escaped, err := module.EscapePath(m.path())
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	zipFile := filepath.Join(dir, version+".zip")
	w, err := os.Create(zipFile)
	if err != nil {
		return nil, err
	}
	// CreateFromDir applies the rules a published zip obeys: nested modules
	// and vendor/ left out, file names and sizes checked.
	err = zip.CreateFromDir(w, module.Version{Path: m.path(), Version: version}, m.dir)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.path(), err)
	}
	goMod, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
	if err != nil {
		return nil, err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return nil, err
	}
	list, err := os.ReadFile(filepath.Join(dir, "list"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if !slices.Contains(strings.Fields(string(list)), version) {
		list = append(list, version+"\n"...)
	}
	for name, data := range map[string][]byte{
		version + ".mod":  goMod,
		version + ".info": info,
		"list":            list,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return nil, err
		}
	}
	zipSum, err := dirhash.HashZip(zipFile, dirhash.Hash1)
	if err != nil {
		return nil, err
	}
	modSum, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(goMod)), nil
	})
	if err != nil {
		return nil, err
	}
	return []string{
		fmt.Sprintf("%s %s %s", m.path(), version, zipSum),
		fmt.Sprintf("%s %s/go.mod %s", m.path(), version, modSum),
	}, nil
}
