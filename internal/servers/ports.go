package servers

import (
	"errors"
	"fmt"
	"net"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. If
// withBus is set, port+10000 (a Redis Cluster node's bus port) was free too.
func FreePort(withBus bool) (int, error) {
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("listen on a loopback port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !withBus {
			l.Close()
			return port, nil
		}
		if port+10000 >= 65536 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port, nil
	}
	return 0, errors.New("no free port after 200 tries")
}
