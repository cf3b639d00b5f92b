package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/alya/recovery"
	"github.com/alya/recovery/internal/redact"
	"github.com/alya/recovery/internal/store"
	"github.com/alya/recovery/ops"
	"github.com/alya/recovery/postgres/pgxreset"
)

// instanceJSON is one instance in JSON output. TTLs are milliseconds; null
// when the key does not exist, -1 when it has no expiry.
type instanceJSON struct {
	InstanceID     string `json:"instance_id"`
	Registered     bool   `json:"registered"`
	Alive          bool   `json:"alive"`
	HeartbeatTTLMs *int64 `json:"heartbeat_ttl_ms"`
	// LastBeatMs is the time since the last heartbeat, from the key's TTL
	// left (see lastBeat); null when the key is absent or the TTL left
	// does not fit --heartbeat-ttl. Late is set while an alive instance's
	// heartbeat is overdue.
	LastBeatMs  *int64 `json:"last_beat_ms"`
	Late        bool   `json:"late"`
	Rows        int64  `json:"rows"`
	RowsTTLMs   *int64 `json:"rows_ttl_ms"`
	Incarnation string `json:"incarnation,omitempty"`
	// Claim is the recovery claim: none, held (being recovered), failed
	// (the last recovery failed) or finished.
	Claim          string `json:"claim"`
	BeingRecovered bool   `json:"being_recovered"`
	// AnnouncedTTLMs and Mode are what the instance announced in the
	// fleet record; absent for a worker that announces nothing.
	AnnouncedTTLMs int64  `json:"announced_ttl_ms,omitempty"`
	Mode           string `json:"mode,omitempty"`
	// OldestRowMs is how long the instance has held the oldest row it
	// tracks, by its heartbeat's report; null when it holds none or did
	// not report (OldestRowKnown false: a worker of an earlier release).
	OldestRowMs    *int64 `json:"oldest_row_ms"`
	OldestRowKnown bool   `json:"oldest_row_known"`
}

func (o *options) toJSON(i ops.InstanceState) instanceJSON {
	j := instanceJSON{
		InstanceID:     i.InstanceID,
		Registered:     i.Registered,
		Alive:          i.Alive(),
		HeartbeatTTLMs: ttlMs(i.HeartbeatPresent, i.HeartbeatTTL),
		Rows:           i.Rows,
		RowsTTLMs:      ttlMs(i.RowsPresent, i.RowsTTL),
		Incarnation:    i.Incarnation,
		Claim:          string(i.Claim),
		BeingRecovered: i.Claim == ops.ClaimHeld,
		AnnouncedTTLMs: i.AnnouncedTTL.Milliseconds(),
		Mode:           i.Mode,
	}
	if b := o.lastBeat(i); b.known {
		ms := b.age.Milliseconds()
		j.LastBeatMs, j.Late = &ms, b.late
	}
	if j.OldestRowKnown = i.OldestRowKnown; i.OldestRowKnown && i.HoldsRows {
		ms := i.OldestRowAge.Milliseconds()
		j.OldestRowMs = &ms
	}
	return j
}

// oldestRowText shows how long an instance has held its oldest row:
// "none" when it holds no row, "unknown" when its heartbeat does not say
// (a worker of an earlier release, or no heartbeat for a TTL).
func oldestRowText(i ops.InstanceState) string {
	switch {
	case !i.OldestRowKnown:
		return "unknown"
	case !i.HoldsRows:
		return "none"
	}
	return roundDuration(i.OldestRowAge)
}

// beat is what an instance's heartbeat key says of its last heartbeat.
type beat struct {
	age   time.Duration // since the last heartbeat, when known
	known bool
	late  bool // alive, but the heartbeat is overdue
}

// lastBeat reads the time since an instance's last heartbeat from its
// heartbeat key's TTL left: every heartbeat sets the key's TTL back to the
// instance's heartbeat TTL (timingsOf), so what has run off since is the
// time since that heartbeat. PTTL answers to the millisecond on every
// Redis version and changes nothing. (OBJECT IDLETIME is not used: a read
// of the key such as GET resets it, it counts whole seconds, and Redis
// refuses it under an LFU maxmemory policy.) The age is unknown when the
// key is absent (dead: the last heartbeat was over a TTL ago), has no
// expiry, or has more TTL left than the instance's TTL. An instance is
// late when no heartbeat came for 1.5 heartbeat intervals: past the ±20%
// jitter of the heartbeat loop, and its key expires at the TTL unless one
// comes.
func (o *options) lastBeat(i ops.InstanceState) beat {
	ttl, interval := o.timingsOf(i)
	if !i.HeartbeatPresent || i.HeartbeatTTL < 0 || i.HeartbeatTTL > ttl {
		return beat{}
	}
	age := ttl - i.HeartbeatTTL
	return beat{age: age, known: true, late: age > interval*3/2}
}

// timingsOf returns the heartbeat TTL and interval of instance i: the
// flags when given; else the TTL i announced in the fleet record, with
// half of it as the interval (the library's default: the record holds no
// interval); else the flags' defaults, the library's.
func (o *options) timingsOf(i ops.InstanceState) (ttl, interval time.Duration) {
	ttl, interval = o.heartbeatTTL, o.heartbeatInterval
	if o.ttlGiven || i.AnnouncedTTL <= 0 {
		return ttl, interval
	}
	ttl = i.AnnouncedTTL
	if !o.intervalGiven || interval >= ttl {
		interval = ttl / 2
	}
	return ttl, interval
}

// lastBeatText shows lastBeat for people.
func (o *options) lastBeatText(i ops.InstanceState) string {
	b := o.lastBeat(i)
	switch {
	case b.known:
		return durText(b.age) + " ago"
	case !i.HeartbeatPresent:
		ttl, _ := o.timingsOf(i)
		return "over " + durText(ttl) + " ago"
	default:
		return "?"
	}
}

// durText shows a duration for people: to the millisecond under a second,
// to 100ms under a minute, else to the second.
func durText(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// beatLegend says how LAST BEAT and "late" are worked out, and which
// instances' last beat cannot be known.
func (o *options) beatLegend(insts []ops.InstanceState) []string {
	line := fmt.Sprintf("LAST BEAT: --heartbeat-ttl %s minus the heartbeat TTL left; late: no heartbeat for over %s (1.5 × --heartbeat-interval %s)",
		durText(o.heartbeatTTL), durText(o.heartbeatInterval*3/2), durText(o.heartbeatInterval))
	if !o.ttlGiven {
		line = fmt.Sprintf("LAST BEAT: the heartbeat TTL each instance announced in the fleet record (else %s) minus the TTL left; late: no heartbeat for over 1.5 heartbeat intervals (%s; --heartbeat-ttl and --heartbeat-interval override)",
			durText(o.heartbeatTTL), intervalText(o))
	}
	lines := []string{line}
	var odd []string
	for _, i := range insts {
		if i.HeartbeatPresent && !o.lastBeat(i).known {
			odd = append(odd, i.InstanceID)
		}
	}
	if len(odd) > 0 {
		lines = append(lines, fmt.Sprintf("LAST BEAT unknown for %s: a heartbeat TTL left longer than its heartbeat TTL, or no expiry; pass the fleet's Timings.HeartbeatTTL as --heartbeat-ttl",
			strings.Join(odd, ", ")))
	}
	return lines
}

// intervalText says which heartbeat interval late is judged by when the
// TTL comes from the fleet record.
func intervalText(o *options) string {
	if o.intervalGiven {
		return "--heartbeat-interval " + durText(o.heartbeatInterval)
	}
	return "half the TTL, the library's default"
}

// fleetCounts counts the alive instances, the late among them, and the dead.
func (o *options) fleetCounts(insts []ops.InstanceState) (alive, late, dead int) {
	for _, i := range insts {
		switch {
		case !i.Alive():
			dead++
		case o.lastBeat(i).late:
			alive++
			late++
		default:
			alive++
		}
	}
	return alive, late, dead
}

// countsText shows fleetCounts.
func countsText(alive, late, dead int) string {
	if late > 0 {
		return fmt.Sprintf("%d alive (%d of them late), %d dead", alive, late, dead)
	}
	return fmt.Sprintf("%d alive, %d dead", alive, dead)
}

// writeWorkers writes the table of instances.
func (o *options) writeWorkers(w io.Writer, insts []ops.InstanceState) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tSTATE\tLAST BEAT\tHEARTBEAT TTL\tROWS\tROWS TTL\tOLDEST ROW")
	for _, i := range insts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", i.InstanceID, o.stateText(i), o.lastBeatText(i),
			ttlText(i.HeartbeatPresent, i.HeartbeatTTL), i.Rows, ttlText(i.RowsPresent, i.RowsTTL), oldestRowText(i))
	}
	tw.Flush()
}

func ttlMs(present bool, ttl time.Duration) *int64 {
	if !present {
		return nil
	}
	ms := int64(-1)
	if ttl >= 0 {
		ms = ttl.Milliseconds()
	}
	return &ms
}

// ttlText shows a TTL for people.
func ttlText(present bool, ttl time.Duration) string {
	switch {
	case !present:
		return "-"
	case ttl < 0:
		return "no expiry"
	case ttl < time.Minute:
		return ttl.Round(100 * time.Millisecond).String()
	default:
		return ttl.Round(time.Second).String()
	}
}

func (o *options) stateText(i ops.InstanceState) string {
	s := "dead"
	switch {
	case !i.Alive():
	case o.lastBeat(i).late:
		s = "late"
	default:
		s = "alive"
	}
	switch i.Claim {
	case ops.ClaimHeld:
		s += ", being recovered"
	case ops.ClaimFailed:
		s += ", last recovery failed"
	case ops.ClaimFinished:
		s += ", just recovered"
	}
	if !i.Registered {
		s += ", not registered"
	}
	return s
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// cmdWorkers lists every registered instance. When the registry is empty
// it says so on stderr, with the prefix: a wrong --prefix looks exactly
// like an idle fleet otherwise.
func cmdWorkers(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	rdb, _, err := connectRedis(ctx, o)
	if err != nil {
		return err
	}
	defer rdb.Close()
	fleet, err := ops.Inspect(ctx, rdb, o.prefix)
	if err != nil {
		return usageIfConfig(err)
	}
	return printWorkers(stdout, stderr, o, cleanFleet(fleet))
}

// printWorkers shows what Inspect read of the fleet: as JSON with --json,
// else as a table with a legend and the counts. An empty registry is said
// on stderr, with the prefix: a wrong --prefix looks exactly like an idle
// fleet otherwise.
func printWorkers(stdout, stderr io.Writer, o *options, fleet ops.FleetState) error {
	insts, invalid := fleet.Instances, fleet.InvalidMembers
	if len(insts) == 0 && len(invalid) == 0 {
		fmt.Fprintf(stderr, "no worker registered under prefix %q: %s is empty or absent; is --prefix the fleet's WithKeyPrefix?\n",
			o.prefix, fleet.Registry)
	}
	if o.json {
		out := struct {
			Prefix         string         `json:"prefix"`
			Registry       string         `json:"registry"`
			Serves         string         `json:"serves"`
			Server         string         `json:"server,omitempty"`
			Workers        []instanceJSON `json:"workers"`
			InvalidMembers []string       `json:"invalid_members"`
		}{Prefix: o.prefix, Registry: fleet.Registry, Serves: fleet.Serves, Server: fleet.Server, Workers: []instanceJSON{}, InvalidMembers: []string{}}
		for _, i := range insts {
			out.Workers = append(out.Workers, o.toJSON(i))
		}
		out.InvalidMembers = append(out.InvalidMembers, invalid...)
		return writeJSON(stdout, out)
	}
	if len(insts) > 0 {
		o.writeWorkers(stdout, insts)
	}
	alive, late, dead := o.fleetCounts(insts)
	fmt.Fprintf(stdout, "%d registered in %s: %s\n", len(insts), fleet.Registry, countsText(alive, late, dead))
	if len(insts) > 0 {
		for _, l := range o.beatLegend(insts) {
			fmt.Fprintln(stdout, l)
		}
	}
	if fleet.Serves != "" {
		fmt.Fprintf(stdout, "the fleet serves %s%s (%s)\n", fleet.Serves, onServer(fleet.Server), store.FleetKey(o.prefix))
	}
	if ttls := announcedTTLs(insts); ttls != "" {
		fmt.Fprintf(stdout, "heartbeat TTLs announced: %s\n", ttls)
	}
	if len(invalid) > 0 {
		fmt.Fprintf(stdout, "ignored %d registry members that are not valid instance IDs: %s\n",
			len(invalid), quoteAll(invalid))
	}
	return nil
}

// cleanFleet is fleet with every string read from Redis cleaned.
func cleanFleet(fleet ops.FleetState) ops.FleetState {
	fleet.Serves, fleet.Server, fleet.InvalidMembers = clean(fleet.Serves), clean(fleet.Server), cleanAll(fleet.InvalidMembers)
	insts := make([]ops.InstanceState, len(fleet.Instances))
	for n, i := range fleet.Instances {
		insts[n] = cleanInstance(i)
	}
	fleet.Instances = insts
	return fleet
}

// cleanInstance is i with every string read from Redis cleaned.
func cleanInstance(i ops.InstanceState) ops.InstanceState {
	i.InstanceID, i.Incarnation, i.Mode = clean(i.InstanceID), clean(i.Incarnation), clean(i.Mode)
	return i
}

// cleanAll cleans each of ss; nil for nil.
func cleanAll(ss []string) []string {
	if ss == nil {
		return nil
	}
	out := make([]string, len(ss))
	for n, s := range ss {
		out[n] = clean(s)
	}
	return out
}

// usageIfConfig makes a configuration error (a bad prefix or instance ID)
// a usage error.
func usageIfConfig(err error) error {
	if errors.Is(err, recovery.ErrInvalidConfig) {
		return &usageError{err.Error()}
	}
	return err
}

// cmdRows shows the rows an instance is tracking.
func cmdRows(ctx context.Context, o *options, id string, stdout io.Writer) error {
	if err := store.ValidateName(id); err != nil {
		return &usageError{fmt.Sprintf("instance ID %q %v", id, err)}
	}
	rdb, _, err := connectRedis(ctx, o)
	if err != nil {
		return err
	}
	defer rdb.Close()
	inst, err := ops.InspectInstance(ctx, rdb, o.prefix, id)
	if err != nil {
		return usageIfConfig(err)
	}
	if !inst.Known() {
		return fmt.Errorf("unknown instance %q: not in %s and no keys of it under prefix %q",
			id, store.RegistryKey(o.prefix), o.prefix)
	}
	tracked, err := ops.ReadTrackedRows(ctx, rdb, o.prefix, id)
	if err != nil {
		return err
	}
	tracked.Incarnation, tracked.InvalidMembers = clean(tracked.Incarnation), cleanAll(tracked.InvalidMembers)
	return printRows(stdout, o, cleanInstance(inst), tracked)
}

// printRows shows an instance and the rows it tracks.
func printRows(stdout io.Writer, o *options, inst ops.InstanceState, tracked ops.TrackedRows) error {
	ids, invalid := tracked.RowIDs, tracked.InvalidMembers
	if o.json {
		out := struct {
			instanceJSON
			RowIDs         []int64  `json:"row_ids"`
			InvalidMembers []string `json:"invalid_members"`
		}{o.toJSON(inst), append([]int64{}, ids...), append([]string{}, invalid...)}
		out.Rows = int64(len(ids) + len(invalid))
		return writeJSON(stdout, out)
	}
	fmt.Fprintf(stdout, "instance %s: %s, last beat %s, heartbeat TTL %s, %d rows tracked (set TTL %s), oldest row held %s\n",
		inst.InstanceID, o.stateText(inst), o.lastBeatText(inst), ttlText(inst.HeartbeatPresent, inst.HeartbeatTTL),
		len(ids)+len(invalid), ttlText(inst.RowsPresent, inst.RowsTTL), oldestRowText(inst))
	for _, n := range ids {
		fmt.Fprintln(stdout, n)
	}
	if len(invalid) > 0 {
		fmt.Fprintf(stdout, "%d members are not row IDs (recovery skips them): %s\n", len(invalid), quoteAll(invalid))
	}
	return nil
}

// rowJSON is a row a reset could neither change nor show settled.
type rowJSON struct {
	RowID  int64  `json:"row_id"`
	Status string `json:"status"`
	// Locked: another session held the row locked (recovery.RowState.Locked).
	Locked bool `json:"locked,omitempty"`
	// Refused: the database refused to change it, a BEFORE UPDATE trigger
	// returning NULL (recovery.RowState.Refused).
	Refused bool `json:"refused,omitempty"`
}

// peerJSON is one dead instance in the output of recover.
type peerJSON struct {
	InstanceID string `json:"instance_id"`
	// Action is, in a dry run, what a scan would do (ops.PlanAction):
	// "reset" (the rows in rows_to_reset, then delete the rows set and
	// deregister), "keep" (rows_not_reset cannot be reset: the rows set
	// and registry entry would be kept), "deregister" (no rows), "lost"
	// (its rows set vanished after a failed recovery), "skip" (another
	// worker is recovering it) or "kept" (it left no rows set while rows
	// no worker holds would stay stuck: sweepPlan). In a real run it is
	// what was done: "recovered", "skipped", "kept" or "failed".
	Action         string    `json:"action"`
	Claim          string    `json:"claim,omitempty"`
	RowIDs         []int64   `json:"row_ids,omitempty"`
	RowsFound      int       `json:"rows_found"`
	RowsToReset    []int64   `json:"rows_to_reset,omitempty"`
	RowsReset      *int64    `json:"rows_reset,omitempty"`
	Quarantined    []int64   `json:"quarantined,omitempty"`
	RowsNotReset   []rowJSON `json:"rows_not_reset,omitempty"`
	InvalidMembers []string  `json:"invalid_members,omitempty"`
	PeerCameBack   bool      `json:"peer_came_back,omitempty"`
	Error          string    `json:"error,omitempty"`
	// RowsGone are tracked rows no row has any more (deleted since they
	// were taken; ops.PeerRecovery.Gone): nothing to reset. Real runs only.
	RowsGone []int64 `json:"rows_gone,omitempty"`
}

type recoverJSON struct {
	DryRun         bool       `json:"dry_run"`
	Sweep          *sweepJSON `json:"sweep,omitempty"`
	PeersChecked   int        `json:"peers_checked"`
	DeadPeers      int        `json:"dead_peers"`
	RowsReset      int64      `json:"rows_reset"`
	RowsNotReset   int        `json:"rows_not_reset"`
	Peers          []peerJSON `json:"peers"`
	InvalidMembers []string   `json:"invalid_members"`
}

// cmdRecover runs one recovery scan, or with --dry-run asks what it would do.
func cmdRecover(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	if o.databaseURL == "" {
		what := "to reset rows"
		if o.dryRun {
			what = "to ask PostgreSQL which rows a reset would change"
		}
		return &usageError{"recover needs --database-url or DATABASE_URL " + what}
	}
	// A bad flag is a usage error, found before any connection.
	if _, err := pgxreset.New(noDB{}, o.pgx.Options()...); err != nil {
		return &usageError{err.Error()}
	}
	rdb, _, err := connectRedis(ctx, o)
	if err != nil {
		return err
	}
	defer rdb.Close()
	w, info, closeDB, err := newWorker(ctx, rdb, o, stderr)
	if err != nil {
		return err
	}
	defer closeDB()
	defer w.Shutdown(context.Background()) // never started: returns at once
	if err := checkFleet(ctx, rdb, o, info); err != nil {
		return err
	}

	var out recoverJSON
	if o.dryRun {
		out, err = plan(ctx, w)
		err = errors.Join(err, sweepPlan(ctx, rdb, w, o, &out))
	} else {
		if o.pgx.OwnerColumn != "" {
			// By owner, the scan resets every dead registered instance's
			// rows; the sweep then finds the owners Redis does not know.
			scanErr := recoverNow(ctx, w, o, nil, &out)
			_, sweepErr := sweepNow(ctx, rdb, w, o, &out)
			err = errors.Join(scanErr, sweepErr, stuckErr(out.Sweep))
		} else {
			// The scan runs even when the sweep failed: the dead instances
			// whose rows sets say which rows they held are recovered.
			keep, sweepErr := sweepNow(ctx, rdb, w, o, &out)
			err = errors.Join(sweepErr, recoverNow(ctx, w, o, keep, &out), stuckErr(out.Sweep))
		}
	}
	if out.Peers == nil {
		out.Peers = []peerJSON{}
	}
	if out.InvalidMembers == nil {
		out.InvalidMembers = []string{}
	}
	if o.json {
		if out.PeersChecked > 0 || out.Sweep != nil || err == nil {
			if werr := writeJSON(stdout, out); werr != nil {
				return werr
			}
		}
		return err
	}
	printRecover(stdout, out)
	return err
}

// noDB stands in for the database while the flags are checked.
type noDB struct{ pgxreset.Execer }

// newWorker returns a recovery.Worker over the fleet's Redis and a
// pgxreset.Resetter built from the flags, after checking it against
// the catalogue (unless --no-schema-check). The Worker is never started:
// no heartbeat, no registration; ops.RecoverNow and ops.PlanRecovery only.
func newWorker(ctx context.Context, rdb redis.UniversalClient, o *options, stderr io.Writer) (*recovery.Worker, recovery.ResetterInfo, func(), error) {
	var info recovery.ResetterInfo
	cfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return nil, info, nil, &usageError{fmt.Sprintf("database URL %s: %v", redact.URL(o.databaseURL), err)}
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.ConnectTimeout = dialTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, info, nil, fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, info, nil, fmt.Errorf("PostgreSQL at %s unreachable: %w", redact.URL(o.databaseURL), err)
	}
	resetter, err := pgxreset.New(pool, o.pgx.Options()...)
	if err != nil {
		pool.Close()
		return nil, info, nil, &usageError{err.Error()}
	}
	if info, err = resetter.Check(ctx, !o.noSchemaCheck); err != nil && !o.noSchemaCheck {
		pool.Close()
		return nil, info, nil, fmt.Errorf("%w (fix the flags or RECOVERY_* variables, or skip the check with --no-schema-check)", err)
	}
	ttl, err := fleetTTL(ctx, rdb, o)
	if err != nil {
		pool.Close()
		return nil, info, nil, err
	}
	w, err := recovery.New(rdb, resetter,
		recovery.WithKeyPrefix(o.prefix),
		// The fleet's timings: the backstop sweep's gap (ops.SweepNow) and
		// the verdicts after a Redis restart wait for the fleet's TTL.
		recovery.WithTimings(recovery.Timings{HeartbeatTTL: ttl, RecoveryInterval: ttl}),
		recovery.WithInstanceID(ctlInstanceID()),
		recovery.WithoutSchemaCheck(), // checked above; Start is never called anyway
		recovery.WithLogger(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		pool.Close()
		return nil, info, nil, &usageError{err.Error()}
	}
	return w, info, pool.Close, nil
}

// checkFleet is Start's fleet check for a Worker that is never started:
// the fleet record under --prefix must serve what the resetter serves
// (info, its Check's result; store.Fleet.Differs, the comparison Start
// makes), and with no --fleet-down the record must exist and the
// registry hold an instance. Under a wrong --prefix or --redis-url the
// registry is empty, so every row in progress would look held by no rows
// set, and live workers' rows would be reset under them.
func checkFleet(ctx context.Context, rdb redis.UniversalClient, o *options, info recovery.ResetterInfo) error {
	serves := info.Serves
	if info.Server != "" {
		serves += " on " + info.Server
	}
	f, err := store.NewRedis(rdb, o.prefix, dialTimeout).ReadFleet(ctx)
	if err != nil {
		return fmt.Errorf("read the fleet record %s: %w", store.FleetKey(o.prefix), err)
	}
	if f.Serves != "" && info.Serves != "" {
		if recorded, theirs, differs := f.Differs(info.Serves, info.Server); differs {
			return fmt.Errorf("%w: the fleet record of prefix %q serves %s, the resetter serves %s: check --prefix, --redis-url, DATABASE_URL and --schema/--table; recover refused, nothing changed",
				recovery.ErrFleetMismatch, o.prefix, recorded, theirs)
		}
	}
	if o.fleetDown {
		return nil
	}
	switch {
	case info.Serves == "":
		return fmt.Errorf("recover refused, nothing changed: the resetter cannot tell what it serves, so the fleet record of prefix %q cannot be checked against it; if the whole fleet is down, run again with --fleet-down", o.prefix)
	case f.Serves == "":
		return fmt.Errorf("recover refused, nothing changed: prefix %q has no fleet record (%s), the resetter serves %s: no worker ever started under this prefix on this Redis, so --prefix or --redis-url is likely wrong, and every live worker's rows would look held by no one; fix them, or if the whole fleet is down, run again with --fleet-down",
			o.prefix, store.FleetKey(o.prefix), serves)
	}
	fleet, err := ops.Inspect(ctx, rdb, o.prefix)
	if err != nil {
		return fmt.Errorf("read the registry: %w", err)
	}
	if len(fleet.Instances) == 0 {
		recorded := f.Serves
		if f.Server != "" {
			recorded += " on " + f.Server
		}
		return fmt.Errorf("recover refused, nothing changed: prefix %q has no registered instance (its fleet record serves %s, the resetter serves %s): under a wrong --prefix or --redis-url every live worker's rows would look held by no one; fix them, or if the whole fleet is down, run again with --fleet-down",
			o.prefix, recorded, serves)
	}
	return nil
}

// fleetTTL is the longest heartbeat TTL the fleet record holds of any
// member, lapsed or not (a dead worker's announcement stays until a live
// one's heartbeat drops it), and --heartbeat-ttl when given and longer:
// the sweep's gap then covers every worker's heartbeat interval.
func fleetTTL(ctx context.Context, rdb redis.UniversalClient, o *options) (time.Duration, error) {
	if err := store.ValidateName(o.prefix); err != nil {
		return 0, &usageError{fmt.Sprintf("key prefix %q %v", o.prefix, err)}
	}
	f, err := store.NewRedis(rdb, o.prefix, dialTimeout).ReadFleet(ctx)
	if err != nil && !store.IsWrongType(err) {
		return 0, fmt.Errorf("read the fleet record %s: %w", store.FleetKey(o.prefix), err)
	}
	ttl := time.Duration(0)
	if o.ttlGiven || len(f.Members) == 0 {
		ttl = o.heartbeatTTL
	}
	for _, m := range f.Members {
		ttl = max(ttl, m.TTL)
	}
	if ttl <= 0 {
		ttl = o.heartbeatTTL // announcements of a zero TTL, written by hand
	}
	// A stray announcement of days must not make the Worker's timings
	// invalid, and recover unusable.
	return min(ttl, maxFleetTTL), nil
}

// maxFleetTTL bounds the heartbeat TTL recover takes from the fleet
// record: far above any real fleet's, far below the library's bounds.
const maxFleetTTL = 24 * time.Hour

// plan asks the library what a scan would do now (ops.PlanRecovery):
// the dead peers as a scan finds them, their rows as a recovery reads
// them, and from PostgreSQL, in a transaction that is rolled back, which
// of those rows a reset would change. Instance IDs are cleaned: a valid
// one may still hold a bidi override.
func plan(ctx context.Context, w *recovery.Worker) (recoverJSON, error) {
	out := recoverJSON{DryRun: true}
	p, err := ops.PlanRecovery(ctx, w)
	out.PeersChecked, out.DeadPeers, out.InvalidMembers = p.PeersChecked, p.DeadPeers, cleanAll(p.InvalidMembers)
	out.RowsReset = int64(p.RowsToReset)
	var (
		kept int
		lost []string
	)
	for _, pp := range p.Peers {
		pj := peerJSON{
			InstanceID: clean(pp.InstanceID), Action: string(pp.Action), Claim: string(pp.Claim),
			RowIDs: pp.Tracked.RowIDs, RowsFound: len(pp.Tracked.RowIDs), RowsToReset: pp.WouldReset,
			Quarantined: pp.Quarantined, RowsNotReset: rowsJSON(pp.NotReset), InvalidMembers: cleanAll(pp.Tracked.InvalidMembers),
		}
		out.RowsNotReset += len(pp.NotReset)
		out.Peers = append(out.Peers, pj)
		switch pp.Action {
		case ops.PlanKeep:
			kept++
		case ops.PlanLost:
			lost = append(lost, clean(pp.InstanceID))
		}
	}
	if err != nil {
		return out, err
	}
	// Where the real run would fail, the dry run fails too.
	var errs []error
	if kept > 0 {
		errs = append(errs, fmt.Errorf("%w: a scan would keep %d rows of %d dead instances, neither reset nor finished, with their rows sets and registry entries, and recover would exit 1. "+
			"Check --status-column, --inprog-status, --queued-status, --done-statuses and --owner-column against the fleet's configuration",
			recovery.ErrRowsNotReset, out.RowsNotReset, kept))
	}
	if len(lost) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s: a scan would deregister them, and recover would exit 1; rows they held may stay in progress: look for them in PostgreSQL",
			recovery.ErrRowsSetLost, strings.Join(lost, ", ")))
	}
	return out, errors.Join(errs...)
}

// recoverNow runs one scan through the library (ops.RecoverNow). A peer
// whose rows could be neither reset nor shown settled keeps its rows set
// and registry entry (recovery.ErrRowsNotReset): that is a failure, and
// says which rows and what to check. Instance IDs are cleaned for the
// output; keep holds them as Redis does.
func recoverNow(ctx context.Context, w *recovery.Worker, o *options, keep []string, out *recoverJSON) error {
	rep, scanErr := ops.RecoverNowKeeping(ctx, w, keep)
	out.PeersChecked, out.DeadPeers, out.RowsReset, out.InvalidMembers =
		rep.PeersChecked, len(rep.Dead), out.RowsReset+rep.RowsReset, cleanAll(rep.InvalidMembers)
	kept := map[string]bool{}
	for _, id := range keep {
		kept[id] = true
	}
	for _, pr := range rep.Recovered {
		n := pr.RowsReset
		out.Peers = append(out.Peers, peerJSON{
			InstanceID: clean(pr.InstanceID), Action: "recovered", RowsFound: pr.RowsFound,
			RowsReset: &n, Quarantined: pr.Quarantined, RowsGone: pr.Gone, InvalidMembers: cleanAll(pr.InvalidMembers), PeerCameBack: pr.PeerCameBack,
		})
	}
	for _, id := range rep.Skipped {
		action := "skipped"
		if kept[id] {
			action = "kept"
		}
		out.Peers = append(out.Peers, peerJSON{InstanceID: clean(id), Action: action})
	}
	failed := map[string]ops.PeerRecovery{}
	for _, pr := range rep.Failed {
		failed[pr.InstanceID] = pr
	}
	var nFailed, notReset int
	for _, e := range unjoin(scanErr) {
		var pe *ops.PeerError
		if !errors.As(e, &pe) {
			return e // the scan itself failed
		}
		nFailed++
		pr := failed[pe.InstanceID]
		n := pr.RowsReset
		notReset += len(pr.NotReset)
		out.Peers = append(out.Peers, peerJSON{InstanceID: clean(pe.InstanceID), Action: "failed",
			RowsFound: pr.RowsFound, RowsReset: &n, Quarantined: pr.Quarantined,
			RowsNotReset: rowsJSON(pr.NotReset), RowsGone: pr.Gone, InvalidMembers: cleanAll(pr.InvalidMembers),
			Error: clean(redact.String(pe.Err.Error(), o.databaseURL, o.redisURL))})
	}
	out.RowsNotReset = notReset
	var err error
	switch {
	case notReset > 0:
		err = fmt.Errorf("%w: %d rows of %d dead instances were neither reset nor finished; their rows sets and registry entries are kept. "+
			"Check --status-column, --inprog-status, --queued-status, --done-statuses and --owner-column against the fleet's configuration",
			recovery.ErrRowsNotReset, notReset, nFailed)
	case nFailed > 0:
		err = fmt.Errorf("%d of %d dead instances could not be recovered; their rows stay tracked for the next scan", nFailed, out.DeadPeers)
	}
	return err
}

func rowsJSON(rs []recovery.RowState) []rowJSON {
	var out []rowJSON
	for _, r := range rs {
		out = append(out, rowJSON{RowID: r.ID, Status: clean(r.Status), Locked: r.Locked, Refused: r.Refused})
	}
	return out
}

// ctlInstanceID is the identity ops.RecoverNow runs under. It never heartbeats
// or registers; it only has to differ from every worker's.
func ctlInstanceID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("recoveryctl-%s-%d", store.Sanitize(host), os.Getpid())
}

func printRecover(w io.Writer, out recoverJSON) {
	if out.DryRun {
		fmt.Fprintf(w, "dry run: %d registered instances checked, %d dead, %d rows would be reset; nothing was changed\n",
			out.PeersChecked, out.DeadPeers, out.RowsReset)
	} else {
		fmt.Fprintf(w, "%d registered instances checked, %d dead, %d rows reset\n", out.PeersChecked, out.DeadPeers, out.RowsReset)
	}
	for _, p := range out.Peers {
		settled := len(p.RowIDs) - len(p.RowsToReset) - len(p.RowsNotReset)
		switch p.Action {
		case string(ops.PlanReset):
			fmt.Fprintf(w, "would reset %s: %d of %d tracked rows (%s); %d are settled (finished, queued or another worker's); then delete its rows set and deregister it\n",
				p.InstanceID, len(p.RowsToReset), p.RowsFound, idList(p.RowsToReset), settled)
		case string(ops.PlanKeep):
			fmt.Fprintf(w, "would keep %s: %d of %d tracked rows can be neither reset nor shown finished (%s); %d would be reset (%s); its rows set and registry entry would stay\n",
				p.InstanceID, len(p.RowsNotReset), p.RowsFound, rowList(p.RowsNotReset), len(p.RowsToReset), idList(p.RowsToReset))
		case string(ops.PlanDeregister):
			fmt.Fprintf(w, "would deregister %s: it tracks no rows\n", p.InstanceID)
		case string(ops.PlanLost):
			fmt.Fprintf(w, "would deregister %s: its rows set vanished after a failed recovery; rows it held may stay in progress\n", p.InstanceID)
		case string(ops.PlanSkip):
			fmt.Fprintf(w, "would skip %s: another worker is recovering it now\n", p.InstanceID)
		case string(ops.PlanUnknown):
			fmt.Fprintf(w, "would hand %d tracked rows of %s to the resetter, which cannot say what it would change\n", p.RowsFound, p.InstanceID)
		case "recovered":
			back := ""
			if p.PeerCameBack {
				back = " (its heartbeat came back: it stays registered)"
			}
			fmt.Fprintf(w, "recovered %s: %d rows tracked, %d reset to queued%s\n", p.InstanceID, p.RowsFound, *p.RowsReset, back)
		case "skipped":
			fmt.Fprintf(w, "skipped %s: another worker is recovering it, or its heartbeat came back\n", p.InstanceID)
		case "kept":
			// Said by printSweep, with the reason.
		case "failed":
			fmt.Fprintf(w, "failed %s: %s\n", p.InstanceID, p.Error)
			if len(p.RowsNotReset) > 0 {
				fmt.Fprintf(w, "  %d of %d tracked rows were neither reset nor finished (%s); %d were reset; its rows set and registry entry are kept\n",
					len(p.RowsNotReset), p.RowsFound, rowList(p.RowsNotReset), *p.RowsReset)
			}
		}
		if len(p.Quarantined) > 0 {
			fmt.Fprintf(w, "  quarantined (recovery limit reached): %s\n", idList(p.Quarantined))
		}
		if len(p.RowsGone) > 0 {
			fmt.Fprintf(w, "  gone: %d tracked rows no longer exist in the table (deleted since taken; nothing to reset): %s\n", len(p.RowsGone), idList(p.RowsGone))
		}
		if len(p.InvalidMembers) > 0 {
			fmt.Fprintf(w, "  %d members of its rows set are not row IDs and are skipped: %s\n", len(p.InvalidMembers), quoteAll(p.InvalidMembers))
		}
	}
	if len(out.InvalidMembers) > 0 {
		fmt.Fprintf(w, "ignored %d registry members that are not valid instance IDs: %s\n", len(out.InvalidMembers), quoteAll(out.InvalidMembers))
	}
	printSweep(w, out)
}

// rowList shows up to 20 rows with their statuses.
func rowList(rs []rowJSON) string {
	const max = 20
	parts := make([]string, 0, min(len(rs), max))
	for i, r := range rs {
		if i == max {
			parts = append(parts, fmt.Sprintf("... %d more", len(rs)-max))
			break
		}
		part := fmt.Sprintf("row %d status %s", r.RowID, strconv.Quote(r.Status))
		if r.Locked {
			part += " (locked by another session)"
		}
		if r.Refused {
			part += " (refused by the database: a trigger)"
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

// idList shows up to 20 row IDs.
func idList(ids []int64) string {
	const max = 20
	if len(ids) == 0 {
		return "none"
	}
	parts := make([]string, 0, min(len(ids), max))
	for i, id := range ids {
		if i == max {
			parts = append(parts, fmt.Sprintf("... %d more", len(ids)-max))
			break
		}
		parts = append(parts, strconv.FormatInt(id, 10))
	}
	return strings.Join(parts, " ")
}

// quoteAll quotes up to 20 strings for a list on one line; they are
// cleaned (clean) where they are read.
func quoteAll(ss []string) string {
	const max = 20
	q := make([]string, 0, min(len(ss), max+1))
	for i, s := range ss {
		if i == max {
			q = append(q, fmt.Sprintf("... %d more", len(ss)-max))
			break
		}
		q = append(q, strconv.Quote(s))
	}
	return strings.Join(q, ", ")
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// announcedTTLs lists the distinct heartbeat TTLs the instances announced,
// with their instances, when they differ: a rolling change of timings,
// during which verdicts wait for the longest (docs/safety.md).
func announcedTTLs(insts []ops.InstanceState) string {
	by := map[time.Duration][]string{}
	var order []time.Duration
	for _, i := range insts {
		if i.AnnouncedTTL <= 0 {
			continue
		}
		if _, ok := by[i.AnnouncedTTL]; !ok {
			order = append(order, i.AnnouncedTTL)
		}
		by[i.AnnouncedTTL] = append(by[i.AnnouncedTTL], i.InstanceID)
	}
	if len(order) < 2 {
		return ""
	}
	parts := make([]string, len(order))
	for n, d := range order {
		parts[n] = fmt.Sprintf("%v (%s)", d, strings.Join(by[d], ", "))
	}
	return strings.Join(parts, "; ")
}

// onServer is " on <server>" for the fleet record's server, "" when none
// is recorded.
func onServer(server string) string {
	if server == "" {
		return ""
	}
	return " on " + server
}
