package testutil

import (
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// NoEviction makes mr answer INFO memory as a Redis server without a
// memory limit (maxmemory 0, maxmemory-policy noeviction), which is what
// miniredis is: it never evicts a key, but has no INFO memory section, and
// a Worker's Start refuses a server whose eviction policy it cannot read.
func NoEviction(mr *miniredis.Miniredis) {
	mr.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		if !strings.EqualFold(cmd, "info") || len(args) != 1 || !strings.EqualFold(args[0], "memory") {
			return false
		}
		c.WriteBulk("# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n")
		return true
	})
}
