// Command containers starts Redis and PostgreSQL in Docker containers for
// the tests of this repository, on a machine with a Docker engine but
// without redis-server or PostgreSQL's binaries. It is a module of its own
// so that testcontainers-go and the Docker client never appear in the
// go.mod (or a user's go.sum) of github.com/alya/recovery: the tests run
// it as a separate process (internal/testutil, through go run).
//
// It answers one request per line on standard input with one line on
// standard output:
//
//	redis            ok <id> <host:port>       a fresh redis:7 container
//	postgres         ok <id> <url>             a fresh postgres:16 container (trust auth)
//	stop <id>        ok                        terminate one container
//
// or "err <message>" when a request fails. When standard input closes it
// terminates every container it started and exits; testcontainers' reaper
// removes them too if the process is killed.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/docker/go-connections/nat"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

func main() {
	s := &server{running: make(map[string]testcontainers.Container)}
	defer s.stopAll()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		reply, err := s.handle(in.Text())
		if err != nil {
			reply = "err " + strings.ReplaceAll(err.Error(), "\n", " ")
		}
		fmt.Println(reply)
	}
}

// server holds the containers started so far.
type server struct {
	running map[string]testcontainers.Container
}

// handle answers one request. testcontainers-go panics when it finds no
// Docker host; that is a failed request, not the helper's end.
func (s *server) handle(line string) (reply string, err error) {
	defer func() {
		if p := recover(); p != nil {
			reply, err = "", fmt.Errorf("%s: %v", line, p)
		}
	}()
	fields := strings.Fields(line)
	switch {
	case len(fields) == 1 && fields[0] == "redis":
		c, addr, err := start(testcontainers.ContainerRequest{
			Image:        "redis:7",
			ExposedPorts: []string{"6379/tcp"},
			WaitingFor:   wait.ForListeningPort("6379/tcp"),
		}, "6379/tcp", 2*time.Minute)
		if err != nil {
			return "", fmt.Errorf("start redis container: %w", err)
		}
		s.running[c.GetContainerID()] = c
		return "ok " + c.GetContainerID() + " " + addr, nil
	case len(fields) == 1 && fields[0] == "postgres":
		c, addr, err := start(testcontainers.ContainerRequest{
			Image:        "postgres:16",
			ExposedPorts: []string{"5432/tcp"},
			Env:          map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"},
			WaitingFor:   wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
		}, "5432/tcp", 3*time.Minute)
		if err != nil {
			return "", fmt.Errorf("start postgres container: %w", err)
		}
		s.running[c.GetContainerID()] = c
		return "ok " + c.GetContainerID() + " postgres://postgres@" + addr + "/postgres?sslmode=disable", nil
	case len(fields) == 2 && fields[0] == "stop":
		c, ok := s.running[fields[1]]
		if !ok {
			return "", fmt.Errorf("no container %s", fields[1])
		}
		delete(s.running, fields[1])
		if err := c.Terminate(context.Background()); err != nil {
			return "", fmt.Errorf("stop container %s: %w", fields[1], err)
		}
		return "ok", nil
	}
	return "", fmt.Errorf("unknown request %q", line)
}

// start starts a container and returns it with the host address of port.
func start(req testcontainers.ContainerRequest, port nat.Port, timeout time.Duration) (testcontainers.Container, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
	if err != nil {
		return nil, "", err
	}
	host, err := c.Host(ctx)
	if err == nil {
		var p nat.Port
		if p, err = c.MappedPort(ctx, port); err == nil {
			return c, host + ":" + p.Port(), nil
		}
	}
	_ = c.Terminate(context.Background())
	return nil, "", err
}

func (s *server) stopAll() {
	for id, c := range s.running {
		_ = c.Terminate(context.Background())
		delete(s.running, id)
	}
}
