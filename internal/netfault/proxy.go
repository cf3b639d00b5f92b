// Package netfault injects network faults between a test's clients and
// the real servers they talk to: a TCP proxy on loopback that can be cut
// (a partition) or made to lose, or to hold back, the reply to one chosen
// request after the server executed it.
package netfault

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy on a loopback port that the fault suite can cut: a
// network partition between the workers and a server, made with the
// standard library. While cut it is a black hole: established connections
// stop carrying bytes in either direction without being closed, and new
// connections are accepted and then ignored, so clients see timeouts, not
// refusals. Restore closes the connections that were held and forwards new
// ones again.
type Proxy struct {
	// Addr is where clients connect (127.0.0.1:port).
	Addr string

	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu       sync.Mutex
	cut      bool
	vanished bool // Vanish: a client that ends leaves its server connection open
	closed   bool
	pairs    map[*pair]struct{}
	drop     *dropArm      // armed by DropReplyTo
	slow     time.Duration // SlowReplies: every reply held this long
}

// pair is one client connection and, while forwarded, its upstream.
type pair struct {
	client, server net.Conn
	held           bool     // cut off: bytes are dropped, the client is closed on Restore
	dropNext       *dropArm // the server's next reply is lost
}

// dropArm is one armed DropReplyTo, or DelayReplyTo when delay is set.
type dropArm struct {
	marker []byte
	delay  time.Duration
	done   chan struct{}
}

// NewProxy listens on a free loopback port and forwards every connection
// to target until Close.
func NewProxy(target string) (*Proxy, error) { return NewProxyOn("127.0.0.1:0", target) }

// NewProxyOn is NewProxy listening on listen (host:port, port 0 for a free
// one): the fault suite puts one on the host side of each veth link, so
// that a worker in a network namespace reaches a server that listens on
// loopback only.
func NewProxyOn(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("proxy for %s: listen: %w", target, err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, pairs: make(map[*pair]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	pr := &pair{client: client}
	p.mu.Lock()
	cut, closed := p.cut, p.closed
	p.mu.Unlock()
	if closed {
		client.Close()
		return
	}
	if !cut {
		server, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			client.Close() // the server is down: the client sees the connection end
			return
		}
		pr.server = server
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		client.Close()
		if pr.server != nil {
			pr.server.Close()
		}
		return
	}
	if p.cut && pr.server != nil { // cut while dialling
		pr.server.Close()
		pr.server = nil
	}
	pr.held = pr.server == nil
	p.pairs[pr] = struct{}{}
	p.mu.Unlock()

	var down sync.WaitGroup
	if pr.server != nil {
		down.Add(1)
		go func() { // server to client
			defer down.Done()
			p.copyReplies(pr)
			p.mu.Lock()
			held := pr.held
			p.mu.Unlock()
			if !held {
				client.Close() // the server ended the connection: pass it on
			}
		}()
	}
	// Client to server, until the client goes away; bytes are dropped
	// once the pair is held.
	buf := make([]byte, 32<<10)
	forward := pr.server != nil
	for {
		n, err := client.Read(buf)
		if n > 0 && forward {
			p.mu.Lock()
			if p.drop != nil && bytes.Contains(buf[:n], p.drop.marker) {
				pr.dropNext, p.drop = p.drop, nil
			}
			p.mu.Unlock()
			if _, werr := pr.server.Write(buf[:n]); werr != nil {
				forward = false
			}
		}
		if err != nil {
			break
		}
	}
	client.Close()
	p.mu.Lock()
	keep := p.vanished
	p.mu.Unlock()
	if pr.server != nil && !keep {
		pr.server.Close()
	}
	down.Wait()
	p.mu.Lock()
	delete(p.pairs, pr)
	p.mu.Unlock()
}

// copyReplies forwards the server's bytes to the client until either side
// ends; a reply the pair must lose is read, dropped, and ends both
// connections, as a network failing right after the server answered.
func (p *Proxy) copyReplies(pr *pair) {
	buf := make([]byte, 32<<10)
	for {
		n, err := pr.server.Read(buf)
		if n > 0 {
			p.mu.Lock()
			arm := pr.dropNext
			pr.dropNext = nil
			slow := p.slow
			p.mu.Unlock()
			if slow > 0 {
				time.Sleep(slow) // SlowReplies: a server that answers late
			}
			if arm != nil && arm.delay > 0 {
				time.Sleep(arm.delay) // the reply is late, not lost
				close(arm.done)
			} else if arm != nil {
				pr.client.Close()
				pr.server.Close()
				close(arm.done)
				return
			}
			if _, werr := pr.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// DropReplyTo arms the proxy once: the next request a client sends whose
// bytes contain marker is forwarded to the server, and the server's reply
// to it is thrown away and both connections closed. The client sees its
// connection end after the server executed the request (go-redis then
// retries it; a database driver reports an unknown outcome). The returned
// channel is closed once the reply was dropped.
func (p *Proxy) DropReplyTo(marker []byte) <-chan struct{} {
	arm := &dropArm{marker: bytes.Clone(marker), done: make(chan struct{})}
	p.mu.Lock()
	p.drop = arm
	p.mu.Unlock()
	return arm.done
}

// DelayReplyTo arms the proxy once, as DropReplyTo, but the server's reply
// to the request is held for d and then forwarded: a client whose deadline
// is shorter than d gives up on a request the server executed (go-redis
// does not retry after a deadline). The returned channel is closed once
// the reply was held for d.
func (p *Proxy) DelayReplyTo(marker []byte, d time.Duration) <-chan struct{} {
	arm := &dropArm{marker: bytes.Clone(marker), delay: d, done: make(chan struct{})}
	p.mu.Lock()
	p.drop = arm
	p.mu.Unlock()
	return arm.done
}

// SlowReplies holds every reply the server sends from now on for d before
// forwarding it (0: none), as a server that answers late: a client whose
// deadline is shorter gives up on each request, which the server ran.
func (p *Proxy) SlowReplies(d time.Duration) {
	p.mu.Lock()
	p.slow = d
	p.mu.Unlock()
}

// Cut turns the proxy into a black hole until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for pr := range p.pairs {
		if !pr.held {
			pr.held = true
			pr.server.Close() // nothing reaches the client any more; it is not told
		}
	}
}

// Vanish makes the hosts behind the clients vanish, as a power loss or a
// partition does: from now on a client connection that ends (its process
// killed) leaves its server connection open, without telling the server,
// the way a server keeps the socket of a host that sent no FIN until TCP
// keepalive gives up (about 2 h 11 min with Linux's defaults). The server
// ends such a connection itself (a PostgreSQL session by
// idle_in_transaction_session_timeout), or Close does.
func (p *Proxy) Vanish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.vanished = true
}

// Restore ends the black hole: the connections held during the cut are
// closed (their clients reconnect) and new connections are forwarded.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	for pr := range p.pairs {
		if pr.held {
			pr.client.Close()
		}
	}
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines. It is safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for pr := range p.pairs {
		pr.client.Close()
		if pr.server != nil {
			pr.server.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
