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
	"github.com/alya/recovery/internal/keys"
	"github.com/alya/recovery/internal/redact"
)

// instanceJSON is one instance in JSON output. TTLs are milliseconds; null
// when the key does not exist, -1 when it has no expiry.
type instanceJSON struct {
	InstanceID     string `json:"instance_id"`
	Registered     bool   `json:"registered"`
	Alive          bool   `json:"alive"`
	HeartbeatTTLMs *int64 `json:"heartbeat_ttl_ms"`
	Rows           int64  `json:"rows"`
	RowsTTLMs      *int64 `json:"rows_ttl_ms"`
	BeingRecovered bool   `json:"being_recovered"`
}

func toJSON(i instance) instanceJSON {
	return instanceJSON{
		InstanceID:     i.ID,
		Registered:     i.Registered,
		Alive:          i.Alive(),
		HeartbeatTTLMs: ttlMs(i.HeartbeatPresent, i.HeartbeatTTL),
		Rows:           i.Rows,
		RowsTTLMs:      ttlMs(i.RowsPresent, i.RowsTTL),
		BeingRecovered: i.BeingRecovered,
	}
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

func stateText(i instance) string {
	s := "dead"
	if i.Alive() {
		s = "alive"
	}
	if i.BeingRecovered {
		s += ", being recovered"
	}
	if i.RecoveryFailed {
		s += ", recovery failed"
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
	ids, invalid, err := registry(ctx, rdb, o.prefix)
	if err != nil {
		return err
	}
	insts, err := describe(ctx, rdb, o.prefix, ids, nil)
	if err != nil {
		return err
	}
	if len(ids) == 0 && len(invalid) == 0 {
		fmt.Fprintf(stderr, "no worker registered under prefix %q: %s is empty or absent; is --prefix the fleet's WithKeyPrefix?\n",
			o.prefix, keys.Registry(o.prefix))
	}
	if o.json {
		out := struct {
			Prefix         string         `json:"prefix"`
			Registry       string         `json:"registry"`
			Workers        []instanceJSON `json:"workers"`
			InvalidMembers []string       `json:"invalid_members"`
		}{Prefix: o.prefix, Registry: keys.Registry(o.prefix), Workers: []instanceJSON{}, InvalidMembers: []string{}}
		for _, i := range insts {
			out.Workers = append(out.Workers, toJSON(i))
		}
		out.InvalidMembers = append(out.InvalidMembers, invalid...)
		return writeJSON(stdout, out)
	}
	alive := 0
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if len(insts) > 0 {
		fmt.Fprintln(tw, "INSTANCE\tSTATE\tHEARTBEAT TTL\tROWS\tROWS TTL")
	}
	for _, i := range insts {
		if i.Alive() {
			alive++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", i.ID, stateText(i),
			ttlText(i.HeartbeatPresent, i.HeartbeatTTL), i.Rows, ttlText(i.RowsPresent, i.RowsTTL))
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d registered in %s: %d alive, %d dead\n",
		len(insts), keys.Registry(o.prefix), alive, len(insts)-alive)
	if len(invalid) > 0 {
		fmt.Fprintf(stdout, "ignored %d registry members that are not valid instance IDs: %s\n",
			len(invalid), quoteAll(invalid))
	}
	return nil
}

// cmdRows shows the rows an instance is tracking.
func cmdRows(ctx context.Context, o *options, id string, stdout io.Writer) error {
	if err := keys.ValidateName(id); err != nil {
		return &usageError{fmt.Sprintf("instance ID %q %v", id, err)}
	}
	rdb, _, err := connectRedis(ctx, o)
	if err != nil {
		return err
	}
	defer rdb.Close()
	registered, err := rdb.SIsMember(ctx, keys.Registry(o.prefix), id).Result()
	if err != nil {
		return fmt.Errorf("read registry %s: %w", keys.Registry(o.prefix), err)
	}
	insts, err := describe(ctx, rdb, o.prefix, []string{id}, map[string]bool{id: registered})
	if err != nil {
		return err
	}
	inst := insts[0]
	if !inst.Registered && !inst.HeartbeatPresent && !inst.RowsPresent && !inst.BeingRecovered {
		return fmt.Errorf("unknown instance %q: not in %s and no keys of it under prefix %q",
			id, keys.Registry(o.prefix), o.prefix)
	}
	ids, invalid, err := rowIDs(ctx, rdb, o.prefix, id)
	if err != nil {
		return err
	}
	if o.json {
		out := struct {
			instanceJSON
			RowIDs         []int64  `json:"row_ids"`
			InvalidMembers []string `json:"invalid_members"`
		}{toJSON(inst), append([]int64{}, ids...), append([]string{}, invalid...)}
		out.Rows = int64(len(ids) + len(invalid))
		return writeJSON(stdout, out)
	}
	fmt.Fprintf(stdout, "instance %s: %s, heartbeat TTL %s, %d rows tracked (set TTL %s)\n",
		id, stateText(inst), ttlText(inst.HeartbeatPresent, inst.HeartbeatTTL),
		len(ids)+len(invalid), ttlText(inst.RowsPresent, inst.RowsTTL))
	for _, n := range ids {
		fmt.Fprintln(stdout, n)
	}
	if len(invalid) > 0 {
		fmt.Fprintf(stdout, "%d members are not row IDs (recovery skips them): %s\n", len(invalid), quoteAll(invalid))
	}
	return nil
}

// peerJSON is one dead instance in the output of recover.
type peerJSON struct {
	InstanceID string `json:"instance_id"`
	// Action is, in a dry run, what the scan would do: "reset" (rows, then
	// the set and the registry entry), "deregister" (no rows) or "skip"
	// (another worker is recovering it). In a real run it is what was done:
	// "recovered", "skipped" or "failed".
	Action         string   `json:"action"`
	RowIDs         []int64  `json:"row_ids,omitempty"`
	RowsFound      int      `json:"rows_found"`
	RowsReset      *int64   `json:"rows_reset,omitempty"`
	InvalidMembers []string `json:"invalid_members,omitempty"`
	PeerCameBack   bool     `json:"peer_came_back,omitempty"`
	Error          string   `json:"error,omitempty"`
}

type recoverJSON struct {
	DryRun         bool       `json:"dry_run"`
	PeersChecked   int        `json:"peers_checked"`
	DeadPeers      int        `json:"dead_peers"`
	RowsReset      int64      `json:"rows_reset"`
	Peers          []peerJSON `json:"peers"`
	InvalidMembers []string   `json:"invalid_members"`
}

// cmdRecover runs one recovery scan, or with --dry-run shows what it would do.
func cmdRecover(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	if !o.dryRun && o.databaseURL == "" {
		return &usageError{"recover needs --database-url or DATABASE_URL to reset rows (or --dry-run)"}
	}
	rdb, _, err := connectRedis(ctx, o)
	if err != nil {
		return err
	}
	defer rdb.Close()
	var out recoverJSON
	if o.dryRun {
		out, err = plan(ctx, rdb, o.prefix)
	} else {
		out, err = recoverNow(ctx, rdb, o, stderr)
	}
	if out.Peers == nil {
		out.Peers = []peerJSON{}
	}
	if out.InvalidMembers == nil {
		out.InvalidMembers = []string{}
	}
	if o.json {
		if out.PeersChecked > 0 || err == nil {
			if werr := writeJSON(stdout, out); werr != nil {
				return werr
			}
		}
		return err
	}
	printRecover(stdout, out)
	return err
}

// plan does what a scan does up to the reset, reading only: registry,
// heartbeats, claims and rows sets.
func plan(ctx context.Context, rdb redis.UniversalClient, prefix string) (recoverJSON, error) {
	out := recoverJSON{DryRun: true}
	ids, invalid, err := registry(ctx, rdb, prefix)
	if err != nil {
		return out, err
	}
	out.InvalidMembers = invalid
	insts, err := describe(ctx, rdb, prefix, ids, nil)
	if err != nil {
		return out, err
	}
	out.PeersChecked = len(insts)
	for _, i := range insts {
		if i.Alive() {
			continue
		}
		out.DeadPeers++
		p := peerJSON{InstanceID: i.ID}
		if i.BeingRecovered {
			p.Action = "skip"
			out.Peers = append(out.Peers, p)
			continue
		}
		p.RowIDs, p.InvalidMembers, err = rowIDs(ctx, rdb, prefix, i.ID)
		if err != nil {
			return out, err
		}
		p.RowsFound = len(p.RowIDs)
		p.Action = "deregister"
		if p.RowsFound > 0 {
			p.Action = "reset"
		}
		out.Peers = append(out.Peers, p)
	}
	return out, nil
}

// recoverNow runs one scan with a recovery.Worker that is never started: no
// heartbeat, no registration, just RecoverNow.
func recoverNow(ctx context.Context, rdb redis.UniversalClient, o *options, stderr io.Writer) (recoverJSON, error) {
	out := recoverJSON{}
	cfg, err := pgxpool.ParseConfig(o.databaseURL)
	if err != nil {
		return out, &usageError{fmt.Sprintf("database URL %s: %v", redact.URL(o.databaseURL), err)}
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.ConnectTimeout = dialTimeout
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return out, fmt.Errorf("open PostgreSQL pool: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return out, fmt.Errorf("PostgreSQL at %s unreachable: %w", redact.URL(o.databaseURL), err)
	}
	ropts := []recovery.ResetterOption{
		recovery.WithTable(o.table),
		recovery.WithIDColumn(o.idColumn),
		recovery.WithStatusColumn(o.status),
	}
	if o.schema != "" {
		ropts = append(ropts, recovery.WithSchema(o.schema))
	}
	if o.ownerColumn != "" {
		ropts = append(ropts, recovery.WithOwnerColumn(o.ownerColumn))
	}
	if o.countColumn != "" {
		ropts = append(ropts, recovery.WithRecoveryCountColumn(o.countColumn))
	}
	resetter, err := recovery.NewPgxResetter(pool, ropts...)
	if err != nil {
		return out, &usageError{err.Error()}
	}
	w, err := recovery.New(rdb, resetter,
		recovery.WithKeyPrefix(o.prefix),
		recovery.WithInstanceID(ctlInstanceID()),
		recovery.WithLogger(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		return out, &usageError{err.Error()}
	}
	defer w.Shutdown(context.Background()) // never started: returns at once

	rep, scanErr := w.RecoverNow(ctx)
	out.PeersChecked, out.DeadPeers, out.RowsReset, out.InvalidMembers =
		rep.PeersChecked, rep.DeadPeers, rep.RowsReset, rep.InvalidMembers
	for _, pr := range rep.Recovered {
		n := pr.RowsReset
		out.Peers = append(out.Peers, peerJSON{
			InstanceID: pr.InstanceID, Action: "recovered", RowsFound: pr.RowsFound,
			RowsReset: &n, InvalidMembers: pr.InvalidMembers, PeerCameBack: pr.PeerCameBack,
		})
	}
	for _, id := range rep.Skipped {
		out.Peers = append(out.Peers, peerJSON{InstanceID: id, Action: "skipped"})
	}
	failed := 0
	for _, e := range unjoin(scanErr) {
		var pe *recovery.PeerError
		if errors.As(e, &pe) {
			failed++
			out.Peers = append(out.Peers, peerJSON{InstanceID: pe.InstanceID, Action: "failed",
				Error: redact.String(pe.Err.Error(), o.databaseURL, o.redisURL)})
			continue
		}
		return out, e // the scan itself failed
	}
	if failed > 0 {
		return out, fmt.Errorf("%d of %d dead instances could not be recovered; their rows stay tracked for the next scan", failed, out.DeadPeers)
	}
	return out, nil
}

// ctlInstanceID is the identity RecoverNow runs under. It never heartbeats
// or registers; it only has to differ from every worker's.
func ctlInstanceID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("recoveryctl-%s-%d", keys.Sanitize(host), os.Getpid())
}

func printRecover(w io.Writer, out recoverJSON) {
	if out.DryRun {
		fmt.Fprintf(w, "dry run: %d registered instances checked, %d dead; nothing was changed\n", out.PeersChecked, out.DeadPeers)
	} else {
		fmt.Fprintf(w, "%d registered instances checked, %d dead, %d rows reset\n", out.PeersChecked, out.DeadPeers, out.RowsReset)
	}
	for _, p := range out.Peers {
		switch p.Action {
		case "reset":
			fmt.Fprintf(w, "would reset %s: the rows among %d tracked that are still in progress (%s), then delete its rows set and deregister it\n",
				p.InstanceID, p.RowsFound, idList(p.RowIDs))
		case "deregister":
			fmt.Fprintf(w, "would deregister %s: it tracks no rows\n", p.InstanceID)
		case "skip":
			fmt.Fprintf(w, "would skip %s: another worker is recovering it now\n", p.InstanceID)
		case "recovered":
			back := ""
			if p.PeerCameBack {
				back = " (its heartbeat came back: it stays registered)"
			}
			fmt.Fprintf(w, "recovered %s: %d rows tracked, %d reset to queued%s\n", p.InstanceID, p.RowsFound, *p.RowsReset, back)
		case "skipped":
			fmt.Fprintf(w, "skipped %s: another worker is recovering it, or its heartbeat came back\n", p.InstanceID)
		case "failed":
			fmt.Fprintf(w, "failed %s: %s\n", p.InstanceID, p.Error)
		}
		if len(p.InvalidMembers) > 0 {
			fmt.Fprintf(w, "  %d members of its rows set are not row IDs and are skipped: %s\n", len(p.InvalidMembers), quoteAll(p.InvalidMembers))
		}
	}
	if len(out.InvalidMembers) > 0 {
		fmt.Fprintf(w, "ignored %d registry members that are not valid instance IDs: %s\n", len(out.InvalidMembers), quoteAll(out.InvalidMembers))
	}
}

// idList shows up to 20 row IDs.
func idList(ids []int64) string {
	const max = 20
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

// quoteAll quotes untrusted strings, so control characters from Redis
// never reach the terminal.
func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
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
