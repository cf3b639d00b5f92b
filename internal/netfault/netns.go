package netfault

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
)

// Real partitions: a worker host in a network namespace of its own, joined
// to the test's (root) namespace by one veth pair per server it talks to,
// so that one server can be cut off and not the other. Everything is made
// with iproute2 (ip netns, ip link, ip route) and needs CAP_NET_ADMIN; the
// addresses are in 10.0.0.0/8, used only on the veth pairs the test
// creates, and every name carries a random tag so parallel runs do not
// collide.
//
//   - Cut: the host end of the link goes down. The namespace end loses its
//     carrier, so nothing crosses in either direction: established
//     connections stall, new ones fail.
//   - DropReplies: a blackhole route in the root namespace for the
//     namespace's address. The worker's packets still reach the server
//     (requests are executed), nothing comes back (replies, ACKs and
//     SYN-ACKs are dropped): an asymmetric partition.

// Namespace is a network namespace made by a test, with its links.
type Namespace struct {
	// Name is the namespace's name (ip netns).
	Name string

	tag   string
	mu    sync.Mutex
	links []*Link
}

// Link is one veth pair between the root namespace and a Namespace, each
// end with an address of a /30.
type Link struct {
	// HostIP is the address of the root namespace's end: a server (or a
	// proxy in front of it) listens there for the namespace's clients.
	HostIP string
	// NSIP is the address of the namespace's end.
	NSIP string

	hostDev string
}

var (
	subnetMu   sync.Mutex
	nextSubnet int
	runOctet   byte // second octet of every address of this process
)

// Probe reports whether this process can make network namespaces and veth
// pairs (root, or CAP_NET_ADMIN, and iproute2 installed): it makes one of
// each and removes them.
func Probe() error {
	ns, err := NewNamespace("probe")
	if err != nil {
		return err
	}
	defer ns.Close()
	_, err = ns.AddLink()
	return err
}

// NewNamespace makes a namespace named recfault-<label>-<random> with its
// loopback up. Close removes it.
func NewNamespace(label string) (*Namespace, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("no ip command (iproute2)")
	}
	tag := randomHex(3)
	n := &Namespace{Name: "recfault-" + label + "-" + tag, tag: tag}
	if err := ip("netns", "add", n.Name); err != nil {
		return nil, err
	}
	if err := ip("-n", n.Name, "link", "set", "lo", "up"); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// AddLink makes a veth pair between the root namespace and n, with
// 10.<run>.<k>.1 on the root end and 10.<run>.<k>.2 on n's end (a fresh
// /30 per link), both up.
func (n *Namespace) AddLink() (*Link, error) {
	subnetMu.Lock()
	if runOctet == 0 {
		runOctet = 100 + randomByte()%100
	}
	k := nextSubnet
	nextSubnet++
	subnetMu.Unlock()
	third := fmt.Sprintf("10.%d.%d.", runOctet, k/64) // 64 /30s per /24
	last := (k % 64) * 4
	l := &Link{
		HostIP:  fmt.Sprintf("%s%d", third, last+1),
		NSIP:    fmt.Sprintf("%s%d", third, last+2),
		hostDev: fmt.Sprintf("rf%s%dh", n.tag, k%100),
	}
	nsDev := fmt.Sprintf("rf%s%dn", n.tag, k%100)
	steps := [][]string{
		{"link", "add", l.hostDev, "type", "veth", "peer", "name", nsDev},
		{"link", "set", nsDev, "netns", n.Name},
		{"addr", "add", l.HostIP + "/30", "dev", l.hostDev},
		{"link", "set", l.hostDev, "up"},
		{"-n", n.Name, "addr", "add", l.NSIP + "/30", "dev", nsDev},
		{"-n", n.Name, "link", "set", nsDev, "up"},
	}
	for i, s := range steps {
		if err := ip(s...); err != nil {
			if i > 0 {
				_ = ip("link", "del", l.hostDev)
			}
			return nil, err
		}
	}
	n.mu.Lock()
	n.links = append(n.links, l)
	n.mu.Unlock()
	return l, nil
}

// Command returns a command that runs bin with args inside n (ip netns
// exec, which execs bin in the same process: signals to the returned
// command's process reach bin).
func (n *Namespace) Command(bin string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, bin}, args...)...)
}

// Close removes n's links and n itself. It is safe to call twice; it
// returns the first error.
func (n *Namespace) Close() error {
	n.mu.Lock()
	links := n.links
	n.links = nil
	n.mu.Unlock()
	var first error
	for _, l := range links {
		_ = ip("route", "del", "blackhole", l.NSIP+"/32") // DropReplies left on
		if err := ip("link", "del", l.hostDev); err != nil && first == nil {
			first = err
		}
	}
	if err := ip("netns", "del", n.Name); err != nil && first == nil && !strings.Contains(err.Error(), "No such file") {
		first = err
	}
	return first
}

// Cut takes the root end of the link down: nothing crosses it.
func (l *Link) Cut() error { return ip("link", "set", l.hostDev, "down") }

// Heal brings the root end of the link up again.
func (l *Link) Heal() error { return ip("link", "set", l.hostDev, "up") }

// DropReplies makes the link one-way: packets from the namespace still
// arrive, packets to it are dropped (a blackhole route in the root
// namespace for its address).
func (l *Link) DropReplies() error { return ip("route", "add", "blackhole", l.NSIP+"/32") }

// RestoreReplies undoes DropReplies.
func (l *Link) RestoreReplies() error { return ip("route", "del", "blackhole", l.NSIP+"/32") }

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randomByte() byte {
	b := make([]byte, 1)
	_, _ = rand.Read(b)
	return b[0]
}
