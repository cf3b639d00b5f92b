// Package modcheck publishes the modules of this repository, as its
// working tree has them, to a file-based module proxy (GOPROXY=file://...),
// so that tests and scripts can resolve github.com/alya/recovery and its
// nested modules the way a user's go command does after a release: by
// version, through a proxy, with no replace directive and no workspace.
//
// It is a module of its own (it needs golang.org/x/mod) that nothing
// imports, so no user of the library ever sees it.
package modcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

// RootPath is the module path of the repository's root module.
const RootPath = "github.com/alya/recovery"

// A Module is one module of the repository.
type Module struct {
	// Path is the module path, Dir its directory relative to the
	// repository root ("." for the root module).
	Path, Dir string
	// File is its parsed go.mod.
	File *modfile.File
}

// PublishedModules returns the root module and every nested module a user
// may require: all go.mod files of the repository except those under
// internal/ (test-only modules) and testdata/. The root comes first.
func PublishedModules(repo string) ([]Module, error) {
	var mods []Module
	err := filepath.WalkDir(repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repo, p)
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "internal", "bin":
				if rel != "." {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if d.Name() != "go.mod" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := modfile.Parse(p, data, nil)
		if err != nil {
			return err
		}
		mods = append(mods, Module{Path: f.Module.Mod.Path, Dir: filepath.Dir(rel), File: f})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("find modules in %s: %w", repo, err)
	}
	if len(mods) == 0 || mods[0].Path != RootPath {
		return nil, fmt.Errorf("%s is not the root of %s", repo, RootPath)
	}
	return mods, nil
}

// RootRequirement returns the version of the root module that every nested
// module requires. It fails if a nested module replaces the root, requires
// no real version of it (v0.0.0 is the placeholder a replace needs), or if
// two nested modules disagree: the release scheme (docs/releasing.md) tags
// them in lockstep.
func RootRequirement(mods []Module) (string, error) {
	version := ""
	for _, m := range mods[1:] {
		for _, r := range m.File.Replace {
			if r.Old.Path == RootPath {
				return "", fmt.Errorf("%s/go.mod replaces %s: users cannot resolve that", m.Dir, RootPath)
			}
		}
		v := ""
		for _, r := range m.File.Require {
			if r.Mod.Path == RootPath {
				v = r.Mod.Version
			}
		}
		switch {
		case v == "":
			return "", fmt.Errorf("%s/go.mod does not require %s", m.Dir, RootPath)
		case !semver.IsValid(v) || v == "v0.0.0":
			return "", fmt.Errorf("%s/go.mod requires %s %s, not a released version", m.Dir, RootPath, v)
		case version != "" && v != version:
			return "", fmt.Errorf("nested modules require %s at %s and %s: release them in lockstep", RootPath, version, v)
		}
		version = v
	}
	if version == "" {
		return "", errors.New("no nested module requires the root module")
	}
	return version, nil
}

// WriteProxy writes every module of mods at version to a module proxy
// tree under dir (<path>/@v/{list,<version>.info,.mod,.zip}), from the
// files git would commit in repo: tracked files and untracked ones that
// .gitignore does not exclude, as they are in the working tree now. A zip
// leaves out nested modules' directories, as the go command's does.
func WriteProxy(dir, repo string, mods []Module, version string) error {
	stage, err := os.MkdirTemp("", "modcheck-stage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	if err := stageTree(repo, stage); err != nil {
		return err
	}
	for _, m := range mods {
		if err := writeModule(dir, filepath.Join(stage, m.Dir), m.Path, version); err != nil {
			return fmt.Errorf("publish %s %s: %w", m.Path, version, err)
		}
	}
	return nil
}

// Env returns the environment for go commands that resolve this
// repository's modules through the file proxy at proxyDir, the way a user's
// go command resolves them from a module proxy: no workspace, -mod=mod, a
// fresh module cache at modcache (so a version published from an earlier
// working tree is never reused), third-party modules from the local module
// cache's download directory and failing that from the configured proxy.
// The checksum database is off: the published modules are not in it, and
// the machine may not reach it.
func Env(proxyDir, modcache string) ([]string, error) {
	out, err := exec.Command("go", "env", "GOPROXY", "GOMODCACHE").Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		return nil, fmt.Errorf("go env GOPROXY GOMODCACHE printed %q", out)
	}
	upstream, cache := strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1])
	return []string{
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw",
		"GOMODCACHE=" + modcache,
		"GOPROXY=file://" + proxyDir + ",file://" + filepath.Join(cache, "cache", "download") + "," + upstream,
		"GOSUMDB=off",
	}, nil
}

// stageTree copies the files git would commit from repo to stage.
func stageTree(repo, stage string) error {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("git ls-files in %s: %w: %s", repo, err, stderr.String())
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(repo, name)
		info, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree, not yet in the index
		}
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			continue // the go command leaves symlinks out of module zips too
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		dst := filepath.Join(stage, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, data, info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}

// writeModule writes one module version's list, info, mod and zip files.
func writeModule(dir, src, path, version string) error {
	escaped, err := module.EscapePath(path)
	if err != nil {
		return err
	}
	vdir := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, "list"), []byte(version+"\n"), 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".info"), info, 0o644); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(vdir, version+".mod"), gomod, 0o644); err != nil {
		return err
	}
	zf, err := os.Create(filepath.Join(vdir, version+".zip"))
	if err != nil {
		return err
	}
	if err := modzip.CreateFromDir(zf, module.Version{Path: path, Version: version}, src); err != nil {
		zf.Close()
		return err
	}
	return zf.Close()
}
