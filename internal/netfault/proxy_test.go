package netfault

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// echoServer echoes every line back until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(c net.Conn, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestProxyForwardsBlackHolesWhileCutAndForwardsAgainAfterRestore(t *testing.T) {
	target := echoServer(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // no goroutine of the proxy outlives Close
	p, err := NewProxy(target)
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c.Close()
	got, err := roundTrip(c, "one", time.Second)
	require.NoError(t, err)
	assert.Equal(t, "one\n", got)

	p.Cut()
	_, err = roundTrip(c, "two", 200*time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne, "an established connection goes silent")
	assert.True(t, ne.Timeout(), "a timeout, not a reset: %v", err)
	c2, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err, "new connections are accepted")
	defer c2.Close()
	_, err = roundTrip(c2, "three", 200*time.Millisecond)
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout(), "and ignored: %v", err)

	p.Restore()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	_, err = c.Read(make([]byte, 1))
	assert.Error(t, err, "held connections are closed on Restore")
	c3, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c3.Close()
	got, err = roundTrip(c3, "four", time.Second)
	require.NoError(t, err)
	assert.Equal(t, "four\n", got)

	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "closing twice is harmless")
}

func TestDropReplyToLosesOneReplyAfterTheServerGotTheRequest(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	received := make(chan string, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					received <- line
					_, _ = c.Write([]byte(line))
				}
			}()
		}
	}()
	defer ln.Close()
	p, err := NewProxy(ln.Addr().String())
	require.NoError(t, err)
	defer p.Close()

	dropped := p.DropReplyTo([]byte("two"))
	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c.Close()
	got, err := roundTrip(c, "one", time.Second)
	require.NoError(t, err, "a request without the marker is answered")
	assert.Equal(t, "one\n", got)
	_, err = roundTrip(c, "two", time.Second)
	require.Error(t, err, "the reply to the marked request is lost")
	var ne net.Error
	assert.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection ends, it does not hang: %v", err)
	<-dropped
	assert.Equal(t, "one\n", <-received)
	assert.Equal(t, "two\n", <-received, "the server got the request")

	c2, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c2.Close()
	got, err = roundTrip(c2, "two", time.Second)
	require.NoError(t, err, "armed once: the next request with the marker is answered")
	assert.Equal(t, "two\n", got)
}

func TestDelayReplyToHoldsOneReplyBack(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // last: after the echo server's clean-up
	p, err := NewProxy(echoServer(t))
	require.NoError(t, err)
	defer p.Close()

	held := p.DelayReplyTo([]byte("two"), 300*time.Millisecond)
	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c.Close()
	got, err := roundTrip(c, "one", time.Second)
	require.NoError(t, err)
	assert.Equal(t, "one\n", got, "a request without the marker is answered at once")

	_, err = roundTrip(c, "two", 100*time.Millisecond)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "a deadline shorter than the delay times out: %v", err)
	<-held
	_ = c.SetDeadline(time.Now().Add(time.Second))
	got, err = bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err, "the reply comes after the delay, on the same connection")
	assert.Equal(t, "two\n", got)

	start := time.Now()
	got, err = roundTrip(c, "two", time.Second)
	require.NoError(t, err, "armed once")
	assert.Equal(t, "two\n", got)
	assert.Less(t, time.Since(start), 250*time.Millisecond)
}

// A vanished client leaves its server connection open: the server sees no
// end of it while the proxy runs (here: a connection it can still write
// to after the client is gone), and Close ends it. Without Vanish the
// client's end is passed on at once.
func TestProxyVanishKeepsTheServerConnectionOfAClientThatEnded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	p, err := NewProxy(ln.Addr().String())
	require.NoError(t, err)
	defer p.Close()

	// serverSeesEnd reports whether the server's side of a connection
	// reads the end of it (EOF) within d.
	serverSeesEnd := func(s net.Conn, d time.Duration) bool {
		_ = s.SetReadDeadline(time.Now().Add(d))
		_, err := s.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}

	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	s := <-accepted
	defer s.Close()
	require.NoError(t, c.Close())
	assert.True(t, serverSeesEnd(s, 5*time.Second), "without Vanish the client's end reaches the server")

	p.Vanish()
	c, err = net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	s = <-accepted
	defer s.Close()
	require.NoError(t, c.Close())
	assert.False(t, serverSeesEnd(s, 300*time.Millisecond), "vanished: the server is not told")
	require.NoError(t, p.Close())
	assert.True(t, serverSeesEnd(s, 5*time.Second), "Close ends it")
}
