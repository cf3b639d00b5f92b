package testutil

import "runtime/debug"

// GoBuildFlags are the go build flags that build a helper program from the
// build cache entries of the running test binary: -race when the binary was
// built with -race. A test that builds a program with them compiles only
// the program's own packages once the test's dependencies are compiled,
// instead of every dependency a second time without the race detector.
func GoBuildFlags() []string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" && s.Value == "true" {
				return []string{"-race"}
			}
		}
	}
	return nil
}
