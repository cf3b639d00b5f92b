package pgcore

import (
	"fmt"
	"strconv"
	"strings"
)

// query is a statement and the names of its arguments, in $n order.
type query struct {
	sql  string
	args []string // "ids", "inprog", "owner", ...
}

// param returns the placeholder of the value called name, adding it the
// first time: a value used twice is passed once.
func (q *query) param(name string) string {
	for i, n := range q.args {
		if n == name {
			return "$" + strconv.Itoa(i+1)
		}
	}
	q.args = append(q.args, name)
	return "$" + strconv.Itoa(len(q.args))
}

// resetValues are the values a reset statement is run with.
type resetValues struct {
	ids         []int64
	owner       string // the instance whose rows these are
	incarnation string
	after       int64 // by owner: the last ID of the previous chunk
	limit       int   // by owner: the chunk's rows; 0 is WithChunkSize
	versions    []string
}

// bind returns the arguments of q.
func (r *Resetter) bind(q query, v resetValues) []any {
	args := make([]any, len(q.args))
	for i, name := range q.args {
		switch name {
		case "ids":
			args[i] = v.ids
		case "inprog":
			args[i] = r.o.InProg
		case "queued":
			args[i] = r.o.Queued
		case "owner":
			args[i] = v.owner
		case "incarnation":
			args[i] = v.incarnation
		case "max":
			args[i] = r.o.MaxRecoveries
		case "chunk":
			args[i] = r.o.ChunkSize
			if v.limit > 0 {
				args[i] = v.limit
			}
		case "after":
			args[i] = v.after
		case "versions":
			args[i] = v.versions
		case "terminal":
			args[i] = r.o.Terminal
		case "settled":
			args[i] = r.o.settled()
		}
	}
	return args
}

// settled are the statuses of a row that needs no reset: queued, done, or
// quarantined.
func (o *Settings) settled() []string {
	out := append([]string{o.Queued}, o.Done...)
	if o.MaxRecoveries > 0 {
		out = append(out, o.Terminal)
	}
	return out
}

// resetShape says which reset statement resetQuery builds.
type resetShape struct {
	// byOwner selects the rows of $owner instead of the rows among $ids:
	// at most $chunk of them, those with the lowest IDs above $after.
	byOwner bool
	// keyset: a reset by owner takes only the rows above $after (every
	// chunk but the first).
	keyset bool
	// ledger records the rows changed in the reset ledger.
	ledger bool
	// unowned also resets, with an owner column, the rows among $ids that
	// have no owner (rows of a dead peer's rows set taken by a worker that
	// does not set the column; resetInTx decides when).
	unowned bool
	// versioned adds the backstop sweep's version guard (versionsQuery).
	versioned bool
}

// ownerGuard is the owner guard on the column of prefix ("r." or ""): the
// row is $owner's, or, with unowned, has no owner.
func (o *Settings) ownerGuard(q *query, prefix string, unowned bool) string {
	g := fmt.Sprintf("%s%s = %s::text", prefix, ident(o.OwnerColumn), q.param("owner"))
	if unowned {
		g = fmt.Sprintf("(%s OR %s%s IS NULL)", g, prefix, ident(o.OwnerColumn))
	}
	return g
}

// versionsQuery builds the backstop sweep's reset (ResetRowStates): the
// rows among $ids still in progress at the version the sweep saw, each
// row's version being its xmin (changed by every UPDATE of the row, not by
// a lock), compared in the statement that locks the rows:
//
//	... WHERE id = ANY($ids) AND status = $inprog
//	    AND (id, xmin::text) IN (SELECT * FROM unnest($ids, $versions))
//
// A row written since the sweep looked (fetched again, finished, reset by
// a peer or by a previous sweep) has another xmin and is left alone, so a
// double reset cannot happen and a retried reset changes nothing. A row a
// concurrent transaction holds locked is skipped (SKIP LOCKED), as by every
// reset; versionRestQuery finds it.
func (o *Settings) versionsQuery() query {
	return o.resetQuery(resetShape{versioned: true})
}

// inProgressQuery lists the rows in progress with their version (xmin).
func (o *Settings) inProgressQuery() string {
	return fmt.Sprintf("SELECT %s, xmin::text FROM %s WHERE %s = $1",
		ident(o.IDColumn), o.tableIdent(), ident(o.StatusColumn))
}

// resetQuery builds the reset statement. It locks the matching rows in ID
// order, skipping rows another session holds locked (SKIP LOCKED: a
// transaction left open on a host that vanished holds its locks until the
// server notices, hours with TCP keepalive's defaults; the reset never
// waits for it, and the caller reports the rows it skipped), updates them with the status guard (and the owner guard when
// fencing) through the primary key (joined with the locked rows instead,
// the planner hashed the whole table for each statement: a sequential
// scan per chunk, whatever the chunk's size), records them in the ledger
// (with ledger: the caller has left
// out of $ids the rows the ledger already holds), and returns the number
// changed, the IDs quarantined and the IDs changed:
//
//	WITH locked  AS (SELECT id FROM t WHERE <match> ORDER BY id FOR UPDATE SKIP LOCKED),
//	     changed AS (UPDATE t SET ... WHERE t.id = ANY(ARRAY(SELECT id FROM locked)) AND <guard> RETURNING ...),
//	     logged  AS (INSERT INTO ledger SELECT $owner, $incarnation, id FROM changed)  -- ledger only
//	SELECT count(*), array_agg(id) FILTER (WHERE status = $terminal), array_agg(id ORDER BY id),
//	       (SELECT array_agg(id) FROM locked WHERE id NOT IN (SELECT id FROM changed)) FROM changed
//
// The fourth column lists the rows it locked and could not change: a BEFORE
// UPDATE trigger returned NULL for them (refused, RowState.Refused).
// goneQuery then names, among the few IDs of a reset by IDs that are
// neither changed nor still matching, those no row has (gone,
// ResetResult.Gone).
//
// versionRestQuery reads, after versionsQuery and in its transaction, the
// rows among $ids still in progress at the version the sweep saw: the
// reset skipped them because another session held them locked (a row it
// reset has its transaction's xmin now, a row written since another). Its
// columns are restQuery's: ID, status, locked, owner (none: the sweep by
// version runs without an owner column).
func (o *Settings) versionRestQuery() query {
	var q query
	id, status := ident(o.IDColumn), ident(o.StatusColumn)
	q.sql = fmt.Sprintf(`SELECT %[1]s, coalesce(%[2]s::text, ''), true, '' FROM %[3]s
WHERE %[2]s = %[4]s AND (%[1]s, xmin::text) IN (SELECT * FROM unnest(%[5]s::bigint[], %[6]s::text[])) ORDER BY %[1]s`,
		id, status, o.tableIdent(), q.param("inprog"), q.param("ids"), q.param("versions"))
	return q
}

// A reset by owner also returns how many rows it locked and the highest
// ID, and the caller runs it again from there until a chunk comes back
// short.
func (o *Settings) resetQuery(s resetShape) query {
	var q query
	id, status, table := ident(o.IDColumn), ident(o.StatusColumn), o.tableIdent()
	fenced := o.OwnerColumn != ""

	var match []string
	if !s.byOwner {
		match = append(match, fmt.Sprintf("%s = ANY(%s::bigint[])", id, q.param("ids")))
	}
	inprog := q.param("inprog")
	match = append(match, fmt.Sprintf("%s = %s", status, inprog))
	if s.versioned {
		match = append(match, fmt.Sprintf("(%s, xmin::text) IN (SELECT * FROM unnest(%s::bigint[], %s::text[]))",
			id, q.param("ids"), q.param("versions")))
	}
	if fenced {
		match = append(match, o.ownerGuard(&q, "", s.unowned))
	}

	newStatus, terminal := q.param("queued"), ""
	if o.MaxRecoveries > 0 {
		terminal = q.param("terminal")
		// Comparing both statuses with the column here gives the parameters
		// the column's type before the CASE below would make them text,
		// which an enum column refuses. Always true: both differ from the
		// in-progress status (validate checks).
		match = append(match, fmt.Sprintf("%s <> %s AND %s <> %s", status, newStatus, status, terminal))
		newStatus = fmt.Sprintf("CASE WHEN r.%s + 1 >= %s THEN %s ELSE %s END",
			ident(o.CountColumn), q.param("max"), terminal, newStatus)
	}
	set := []string{fmt.Sprintf("%s = %s", status, newStatus)}
	if fenced {
		set = append(set, ident(o.OwnerColumn)+" = NULL")
	}
	if o.CountColumn != "" {
		set = append(set, fmt.Sprintf("%s = r.%s + 1", ident(o.CountColumn), ident(o.CountColumn)))
	}
	guard := []string{fmt.Sprintf("r.%s = %s", status, inprog)}
	if fenced {
		guard = append(guard, o.ownerGuard(&q, "r.", s.unowned))
	}
	quarantined := "NULL::bigint[]"
	if o.MaxRecoveries > 0 {
		quarantined = fmt.Sprintf("array_agg(id) FILTER (WHERE st = %s)", terminal)
	}

	var sql strings.Builder
	limit := ""
	if s.byOwner {
		// Keyset chunks: the rows after the last one of the previous
		// chunk, so an index on (owner, id) WHERE status = in progress
		// seeks straight to them. The first chunk has no lower bound:
		// row IDs may be zero or negative.
		if s.keyset {
			match = append(match, fmt.Sprintf("%s > %s", id, q.param("after")))
		}
		limit = " LIMIT " + q.param("chunk")
	}
	fmt.Fprintf(&sql, `WITH locked AS (
	SELECT %[1]s FROM %[2]s WHERE %[3]s ORDER BY %[1]s%[7]s FOR UPDATE SKIP LOCKED
), changed AS (
	UPDATE %[2]s AS r SET %[4]s WHERE r.%[1]s = ANY(ARRAY(SELECT %[1]s FROM locked)) AND %[5]s
	RETURNING r.%[1]s AS id, r.%[6]s AS st
)`, id, table, strings.Join(match, " AND "), strings.Join(set, ", "), strings.Join(guard, " AND "), status, limit)
	if s.ledger {
		fmt.Fprintf(&sql, `, logged AS (
	INSERT INTO %s (instance_id, incarnation, row_id)
	SELECT %s::text, %s::text, id FROM changed ON CONFLICT DO NOTHING
)`, o.ledgerIdent(), q.param("owner"), q.param("incarnation"))
	}
	// The rows it locked and did not change: the database refused them (a
	// BEFORE UPDATE trigger returning NULL). A row another session held
	// locked is not among them: SKIP LOCKED passed it over.
	fmt.Fprintf(&sql, "\nSELECT count(*), %s, array_agg(id ORDER BY id), (SELECT array_agg(l.%s ORDER BY l.%s) FROM locked l WHERE l.%s NOT IN (SELECT id FROM changed))",
		quarantined, id, id, id)
	if s.byOwner {
		fmt.Fprintf(&sql, ", (SELECT count(*) FROM locked), (SELECT coalesce(max(%s), 0) FROM locked)", id)

	}
	sql.WriteString(" FROM changed")
	q.sql = sql.String()
	return q
}

// restQuery reads, after the reset and in its transaction, the rows among
// $ids that are not settled, with their status and owner: not queued, done
// or quarantined, and not owned by another worker (fencing: an owner that
// is provably another value; a row with no owner is not settled); rows
// the ledger holds are left out of $ids beforehand (resetInTx). A
// statement of its own, so it sees what the reset changed and what
// transactions committed since it ran. Its third column says whether the
// row still matches the reset (in progress, and owned by the dead
// instance when fencing, or without an owner for a reset that took those,
// unowned): the reset skipped it because another session held it locked
// (SKIP LOCKED), or that session committed it back in progress since.
func (o *Settings) restQuery(unowned bool) query {
	var q query
	id, status := ident(o.IDColumn), ident(o.StatusColumn)
	settled := []string{fmt.Sprintf("t.%s::text = ANY(%s::text[])", status, q.param("settled"))}
	matches := []string{fmt.Sprintf("t.%s::text = %s::text", status, q.param("inprog"))}
	owner := "''"
	if o.OwnerColumn != "" {
		col := ident(o.OwnerColumn)
		owner = fmt.Sprintf("coalesce(t.%s::text, '')", col)
		settled = append(settled, fmt.Sprintf("t.%[1]s IS NOT NULL AND t.%[1]s <> %[2]s::text", col, q.param("owner")))
		matches = append(matches, o.ownerGuard(&q, "t.", unowned))
	}
	q.sql = fmt.Sprintf(`SELECT t.%[1]s, coalesce(t.%[2]s::text, ''), (%[6]s) IS TRUE, %[7]s FROM %[3]s AS t
WHERE t.%[1]s = ANY(%[4]s::bigint[]) AND (%[5]s) IS NOT TRUE ORDER BY t.%[1]s`,
		id, status, o.tableIdent(), q.param("ids"), strings.Join(settled, " OR "), strings.Join(matches, " AND "), owner)
	return q
}

// ownedRestQuery reads, after a reset by owner and in its transaction, the
// rows still in progress and owned by $owner: the reset skipped them
// because another session held them locked (SKIP LOCKED).
func (o *Settings) ownedRestQuery() query {
	var q query
	id, status := ident(o.IDColumn), ident(o.StatusColumn)
	q.sql = fmt.Sprintf(`SELECT %[1]s, coalesce(%[2]s::text, ''), true, %[5]s::text FROM %[3]s
WHERE %[2]s = %[4]s AND %[5]s = %[6]s::text ORDER BY %[1]s`,
		id, status, o.tableIdent(), q.param("inprog"), ident(o.OwnerColumn), q.param("owner"))
	return q
}
