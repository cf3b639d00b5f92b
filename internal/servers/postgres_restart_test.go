package servers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/servers"
	"github.com/alya/recovery/internal/testutil"
)

func TestHaltedPostgresRefusesConnectionsAndResumesWithItsData(t *testing.T) {
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
	_, err = c.Exec(ctx, `CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)`)
	require.NoError(t, err)

	require.NoError(t, pg.Halt())
	require.NoError(t, pg.Halt(), "halting twice is harmless")
	assert.Error(t, c.Ping(ctx), "the open session was ended")
	_, err = pgx.Connect(ctx, pg.URL)
	assert.Error(t, err, "new connections are refused")

	require.NoError(t, pg.Resume(ctx))
	assert.Error(t, pg.Resume(ctx), "resuming a running server is refused")
	c2, err := pgx.Connect(ctx, pg.URL)
	require.NoError(t, err)
	defer c2.Close(ctx)
	var v int
	require.NoError(t, c2.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v))
	assert.Equal(t, 42, v, "the data survived")
}
