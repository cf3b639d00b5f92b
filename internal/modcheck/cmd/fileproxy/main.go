// Command fileproxy writes the modules of this repository, as the working
// tree has them, to a file-based module proxy under -out, and prints the
// environment (one VAR=value a line) for go commands that resolve them
// through it, with a fresh module cache under -out (see modcheck.Env):
//
//	go run ./cmd/fileproxy -repo ../.. -out /tmp/proxy
//
// The version is the one the nested modules require of the root module
// (see docs/releasing.md), unless -version says otherwise. scripts/tidy.sh
// uses it to tidy the nested modules before the root version they require
// is tagged.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/alya/recovery/internal/modcheck"
)

func main() {
	repo := flag.String("repo", ".", "the repository's root directory")
	out := flag.String("out", "", "the proxy directory to write (required)")
	version := flag.String("version", "", "the version to publish every module at (default: the one nested modules require)")
	flag.Parse()
	if err := run(*repo, *out, *version); err != nil {
		fmt.Fprintln(os.Stderr, "fileproxy:", err)
		os.Exit(1)
	}
}

func run(repo, out, version string) error {
	if out == "" {
		return fmt.Errorf("-out is required")
	}
	mods, err := modcheck.PublishedModules(repo)
	if err != nil {
		return err
	}
	if version == "" {
		if version, err = modcheck.RootRequirement(mods); err != nil {
			return err
		}
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	proxy := filepath.Join(abs, "proxy")
	if err := modcheck.WriteProxy(proxy, repo, mods, version); err != nil {
		return err
	}
	env, err := modcheck.Env(proxy, filepath.Join(abs, "modcache"))
	if err != nil {
		return err
	}
	fmt.Println(strings.Join(env, "\n"))
	return nil
}
