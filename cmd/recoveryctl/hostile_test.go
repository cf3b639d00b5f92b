package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/internal/testutil"
)

// Hostile strings anyone who can write to Redis may leave there: a window
// title and a cleared screen, a fake green status line, an OSC 52
// clipboard write, a C1 CSI, invalid UTF-8, a bidi override, and 4 MiB.
var (
	hostileTitle = "\x1b]0;pwned\x07\x1b[2J\x1b[H\x1b[32mall 3 workers alive\x1b[0m\n"
	hostileClip  = "\x1b]52;c;cm0gLXJmIH4K\x07"
	hostileMixed = "x\u009b2J\xff\xfe\u202etxt.exe\r\x7f"
	hostileHuge  = strings.Repeat("\x1b[5m!", (4<<20)/5)
	// hostileIDs are instance IDs store.ValidateName accepts (a bidi
	// override is a printable name part), so the library recovers, keeps
	// and deregisters them like any other: the first left no rows set,
	// the second tracks row 2.
	hostileIDs = []string{"dead\u202e1", "dead\u202e2"}
)

// TestEveryCommandCleansWhatRedisHolds writes hostile strings straight
// into every key recoveryctl reads (fleet record: serves, server, a
// member's mode; registry members; an incarnation, a rows set and a claim;
// the scan turn's holder; the history stream; a TTL of years; and dead
// instances whose valid IDs hold a bidi override, one with no rows set
// while row 3 is in progress and no rows set holds it, so that recover
// would deregister, keeps, skips and recovers hostile IDs) and runs every
// command in every output mode: nothing reaching stdout or
// stderr holds a control character (but newline) or invalid UTF-8, each
// output stays small, and each command still prints its report.
func TestEveryCommandCleansWhatRedisHolds(t *testing.T) {
	url := testutil.RedisURL(t)
	rdb := client(t, url)
	ctx := context.Background()
	prefix := testutil.Name("CTL")
	db := testutil.Postgres(t)
	testutil.CreateBatch(t, db, 3)
	schema := db.Config().ConnConfig.RuntimeParams["search_path"]

	plantAlive(t, rdb, prefix, "w-1")
	plantDead(t, rdb, prefix, "dead-1", "1", hostileClip, hostileHuge, hostileMixed)
	k := store.InstanceKeys(prefix, "dead-1")
	require.NoError(t, rdb.Set(ctx, k.Incarnation, hostileClip, time.Hour).Err())
	require.NoError(t, rdb.Set(ctx, k.Claim, hostileTitle, time.Hour).Err())
	require.NoError(t, rdb.SAdd(ctx, store.RegistryKey(prefix), hostileTitle, hostileHuge, hostileMixed).Err())
	require.NoError(t, rdb.HSet(ctx, store.FleetKey(prefix), "serves", hostileTitle, "server", hostileHuge,
		"m:w-1", "60000 1000 1000 "+strings.ReplaceAll(hostileClip, " ", "")+" 99999999999999",
		"m:ages", "999999999999 1 1 rows-set 99999999999999").Err()) // a TTL of 31 years
	require.NoError(t, rdb.Set(ctx, store.ScanTurnKey(prefix), hostileHuge, time.Hour).Err())
	for _, id := range hostileIDs {
		require.NoError(t, store.ValidateName(id), "%q", id)
	}
	plantHostileIDs := func() {
		plantDead(t, rdb, prefix, hostileIDs[0])
		plantDead(t, rdb, prefix, hostileIDs[1], "2")
	}
	plantHostileIDs()
	_, err := db.Exec(ctx, `UPDATE batchrows SET status = 'inprog' WHERE rowid = 3`)
	require.NoError(t, err)
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: store.HistoryKey(prefix), Values: []any{
		store.HistoryFieldKind, "recovery_failed", store.HistoryFieldInstance, hostileTitle, store.HistoryFieldPeer, hostileMixed,
		store.HistoryFieldFoundBy, hostileClip, store.HistoryFieldError, hostileHuge}}).Err())
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: store.HistoryKey(prefix), Values: []any{
		store.HistoryFieldKind, hostileClip, store.HistoryFieldInstance, hostileHuge, store.HistoryFieldError, hostileTitle}}).Err())

	base := []string{"--redis-url", url, "--prefix", prefix}
	pg := []string{"--schema", schema, "--no-schema-check"}
	env := map[string]string{"DATABASE_URL": testutil.PostgresURL(t)}
	for _, args := range [][]string{
		{"workers"}, {"workers", "--json"},
		{"rows", "dead-1"}, {"rows", "dead-1", "--json"},
		{"history"}, {"history", "--json"},
		{"watch", "--plain", "--count", "1"},
		append([]string{"recover", "--dry-run"}, pg...), append([]string{"recover", "--dry-run", "--json"}, pg...),
		append([]string{"recover", "--json"}, pg...), append([]string{"recover"}, pg...),
	} {
		if args[0] == "recover" {
			// recover refuses a fleet record serving another table (the
			// planted one): without it, and with the whole fleet said to
			// be down, it shows the planted registry and rows.
			require.NoError(t, rdb.HDel(ctx, store.FleetKey(prefix), "serves", "server").Err())
			args = append(args, "--fleet-down")
			plantHostileIDs() // a real run before deregistered one
		}
		out, errOut, _ := ctl(t, env, append(base, args...)...)
		for name, got := range map[string]string{"stdout": out, "stderr": errOut} {
			assertShowable(t, fmt.Sprint(args, " ", name), got)
		}
		assert.NotEmpty(t, out, args)
		if args[0] == "recover" {
			// Each recover mode showed the hostile IDs, cleaned.
			assert.Contains(t, out, "dead 1", args)
			assert.Contains(t, out, "dead 2", args)
		}
	}

	// Above, the planted TTL of years makes Redis too young for a verdict,
	// so the real runs keep and skip. Under a fresh prefix with a TTL of
	// 1s, recover recovers a hostile ID: text and JSON.
	for _, args := range [][]string{{"recover"}, {"recover", "--json"}} {
		fresh := testutil.Name("CTL")
		plantDead(t, rdb, fresh, hostileIDs[1], "2")
		out, errOut, code := ctl(t, env, append(append([]string{"--redis-url", url, "--prefix", fresh, "--heartbeat-ttl", "1s"}, args...),
			append(pg, "--fleet-down")...)...)
		for name, got := range map[string]string{"stdout": out, "stderr": errOut} {
			assertShowable(t, fmt.Sprint(args, " fresh prefix ", name), got)
		}
		assert.Contains(t, out, "dead 2", args)
		assert.Regexp(t, `recovered dead 2|"action": "recovered"`, out, args)
		// The exit code is not this test's concern (the sweep's check
		// holds: the planted rows set holds only a queued row).
		_ = code
	}
}

// assertShowable fails when s holds anything a terminal would act on, or
// more than 64 KiB.
func assertShowable(t *testing.T, what, s string) {
	t.Helper()
	assert.True(t, utf8.ValidString(s), "%s: invalid UTF-8", what)
	for i, r := range s {
		if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r)) {
			assert.Failf(t, "control character reached the terminal", "%s: %U at byte %d: %q", what, r, i, s[max(0, i-40):min(len(s), i+40)])
			break
		}
	}
	assert.Less(t, len(s), 64<<10, "%s: %d bytes", what, len(s))
}
