package netfault

import (
	"bufio"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/testutil"
)

// TestNamespaceLinkCarriesCutsAndHeals checks the partition primitives on
// a real namespace: a client in it reaches a listener on the link's host
// address, not while the link is cut, again once healed, and the
// namespace and its veth are gone after Close.
func TestNamespaceLinkCarriesCutsAndHeals(t *testing.T) {
	if err := Probe(); err != nil {
		testutil.Unavailable(t, "cannot make network namespaces here: %v", err)
	}
	ns, err := NewNamespace("test")
	require.NoError(t, err)
	t.Cleanup(func() { ns.Close() })
	l, err := ns.AddLink()
	require.NoError(t, err)

	ln, err := net.Listen("tcp", l.HostIP+":0")
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan string, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, _ := bufio.NewReader(c).ReadString('\n')
			got <- strings.TrimSpace(s)
			c.Close()
		}
	}()
	send := func(msg, bound string) error {
		// bash's /dev/tcp, inside the namespace, within bound: generous
		// where the message must cross (starting bash in the namespace
		// took more than 1 s once, on a loaded 2-core machine), 1 s where
		// it must not.
		return ns.Command("timeout", bound, "bash", "-c", "echo "+msg+" >/dev/tcp/"+strings.Replace(ln.Addr().String(), ":", "/", 1)).Run()
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash for the client inside the namespace")
	}
	// A send that connected and was killed by its timeout before it wrote
	// (bash slow on a loaded machine) arrives as an empty line: skipped.
	receive := func() string {
		for {
			if m := <-got; m != "" {
				return m
			}
		}
	}
	require.NoError(t, send("before", "10"))
	assert.Equal(t, "before", receive())

	require.NoError(t, l.Cut())
	assert.Error(t, send("cut", "1"), "nothing crosses a cut link")
	require.NoError(t, l.Heal())
	require.Eventually(t, func() bool { return send("healed", "1") == nil }, 5*time.Second, 100*time.Millisecond)
	assert.Equal(t, "healed", receive())

	require.NoError(t, l.DropReplies())
	assert.Error(t, send("oneway", "1"), "no SYN-ACK comes back while replies are dropped")
	require.NoError(t, l.RestoreReplies())
	require.NoError(t, send("back", "10"))
	// A "healed" whose send timed out (bash slow to start) may still have
	// crossed, and a later one too: skip any such duplicate.
	next := receive()
	for next == "healed" {
		next = receive()
	}
	assert.Equal(t, "back", next)

	require.NoError(t, ns.Close())
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	require.NoError(t, err)
	assert.NotContains(t, string(out), ns.Name, "namespace removed")
	out, err = exec.Command("ip", "link", "show", l.hostDev).CombinedOutput()
	assert.Error(t, err, "veth removed: %s", out)
	require.NoError(t, ns.Close(), "Close twice")
}
