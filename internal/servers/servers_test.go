package servers_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/testutil"
)

func TestFreePortCanBeListenedOn(t *testing.T) {
	for _, bus := range []bool{false, true} {
		port, err := servers.FreePort(bus)
		require.NoError(t, err)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		require.NoError(t, err, "port %d free", port)
		l.Close()
		if bus {
			assert.Less(t, port+10000, 65536, "bus port exists")
		}
	}
}

func TestStartPostgresServesUntilStopRemovesEverything(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts PostgreSQL: skipped in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg, err := servers.StartPostgres(ctx)
	if errors.Is(err, servers.ErrNoPostgresBinaries) {
		testutil.Unavailable(t, "%v", err)
	}
	require.NoError(t, err)
	t.Cleanup(pg.Stop)

	c, err := pgx.Connect(ctx, pg.URL)
	require.NoError(t, err)
	var one int
	require.NoError(t, c.QueryRow(ctx, "SELECT 1").Scan(&one))
	assert.Equal(t, 1, one)
	require.NoError(t, c.Close(ctx))
	pid := pg.Pid()
	require.NotZero(t, pid)

	pg.Stop()
	pg.Stop() // idempotent
	_, err = os.Stat(pg.Dir)
	assert.True(t, os.IsNotExist(err), "data folder removed")
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "postmaster gone")
	_, err = pgx.Connect(ctx, pg.URL)
	assert.Error(t, err, "nothing listens any more")
}

func TestStartPostgresHonoursAnEndedContext(t *testing.T) {
	if _, err := servers.PostgresBinDir(); err != nil {
		t.Skipf("no PostgreSQL binaries: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	pg, err := servers.StartPostgres(ctx)
	require.Error(t, err)
	assert.Nil(t, pg)
}
