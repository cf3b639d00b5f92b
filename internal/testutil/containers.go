package testutil

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/docker/go-connections/nat"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// The last resort, for a machine with a Docker engine but without the
// servers' binaries: testcontainers-go. Tests that must kill, pause or
// restart a server, or need a Cluster, want a local process and do not use
// this.

// dockerReachable reports whether a Docker engine may be there to ask.
func dockerReachable() bool {
	if os.Getenv("DOCKER_HOST") != "" {
		return true
	}
	_, err := os.Stat("/var/run/docker.sock")
	return err == nil
}

// containerRedisAddr starts a Redis container for the test and returns its
// address.
func containerRedisAddr(t testing.TB) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        "redis:7",
			ExposedPorts: []string{"6379/tcp"},
			WaitingFor:   wait.ForListeningPort("6379/tcp"),
		},
		Started: true,
	})
	if err != nil {
		return "", fmt.Errorf("start redis container: %w", err)
	}
	t.Cleanup(func() { _ = c.Terminate(context.Background()) })
	return endpoint(ctx, c, "6379/tcp")
}

var (
	pgContainerOnce sync.Once
	pgContainerURL  string
	pgContainerErr  error
)

// containerPostgresURL starts one PostgreSQL container per test binary,
// stopped by Main.
func containerPostgresURL() (string, error) {
	pgContainerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
			ContainerRequest: testcontainers.ContainerRequest{
				Image:        "postgres:16",
				ExposedPorts: []string{"5432/tcp"},
				Env:          map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"},
				WaitingFor:   wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
			},
			Started: true,
		})
		if err != nil {
			pgContainerErr = fmt.Errorf("start postgres container: %w", err)
			return
		}
		onExit(func() { _ = c.Terminate(context.Background()) })
		addr, err := endpoint(ctx, c, "5432/tcp")
		if err != nil {
			pgContainerErr = err
			return
		}
		pgContainerURL = "postgres://postgres@" + addr + "/postgres?sslmode=disable"
	})
	return pgContainerURL, pgContainerErr
}

func endpoint(ctx context.Context, c testcontainers.Container, port nat.Port) (string, error) {
	host, err := c.Host(ctx)
	if err != nil {
		return "", err
	}
	p, err := c.MappedPort(ctx, port)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s:%s", host, p.Port()), nil
}
