// Command modproxy lays Go modules out as a module proxy in a directory, in
// the form a published tag has: <path>/@v/list, VERSION.info, VERSION.mod and
// VERSION.zip (served with GOPROXY=file://DIR). scripts/release-check.sh uses
// it to build consumers against a release before the release is tagged.
//
//	modproxy -proxy DIR -version V [-release] MODDIR...
//
// With -release, each module's go.mod is first edited as the release commit
// edits it: every requirement on another of the named modules is set to V and
// the local replace of it dropped (a replace in a dependency's go.mod is
// ignored by its consumers, so only the requirement's version counts).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	proxy := flag.String("proxy", "", "proxy directory to write")
	version := flag.String("version", "", "the version to publish the modules at")
	release := flag.Bool("release", false, "set requirements on the named modules to -version and drop their replaces first")
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

func run(proxy, version string, release bool, dirs []string) error {
	mods := make([]mod, 0, len(dirs))
	paths := map[string]bool{}
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
		mods = append(mods, mod{dir, f})
		paths[f.Module.Mod.Path] = true
	}
	for _, m := range mods {
		if release {
			if err := setRequirements(m, paths, version); err != nil {
				return err
			}
		}
		if err := publish(proxy, m, version); err != nil {
			return err
		}
	}
	return nil
}

// setRequirements rewrites m's go.mod: requirements on the other modules at
// version, their replaces gone.
func setRequirements(m mod, paths map[string]bool, version string) error {
	f := m.file
	for _, r := range slices.Clone(f.Replace) {
		if paths[r.Old.Path] {
			if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	for _, r := range f.Require {
		if paths[r.Mod.Path] {
			if err := f.AddRequire(r.Mod.Path, version); err != nil {
				return err
			}
		}
	}
	f.Cleanup()
	data, err := f.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(m.dir, "go.mod"), data, 0o644)
}

// publish writes m at version into proxy, as the module proxy protocol lays
// it out (https://go.dev/ref/mod#goproxy-protocol).
func publish(proxy string, m mod, version string) error {
	path := m.file.Module.Mod.Path
	escaped, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	dir := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	v := module.Version{Path: path, Version: version}
	var zipBuf bytes.Buffer
	// CreateFromDir applies the rules a published zip obeys: nested modules
	// and vendor/ left out, file names and sizes checked.
	if err := zip.CreateFromDir(&zipBuf, v, m.dir); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	goMod, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
	if err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	list, err := os.ReadFile(filepath.Join(dir, "list"))
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if !slices.Contains(strings.Fields(string(list)), version) {
		list = append(list, version+"\n"...)
	}
	for name, data := range map[string][]byte{
		version + ".zip":  zipBuf.Bytes(),
		version + ".mod":  goMod,
		version + ".info": info,
		"list":            list,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
