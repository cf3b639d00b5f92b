package recovery

import (
	"strings"

	"github.com/alya/recovery/internal/store"
)

// Owner values (docs/safety.md §2, "Per-life owner values"). The owner
// column names who holds a row. A bare instance ID names every life of the
// worker: a recovery by owner of a worker judged dead also reaches rows it
// took after it came back, which is why a regained lease is held when a
// worker's rows carry bare values (lease.hold). A per-life value names one
// life:
//
//	<instanceID>{<life>}
//
// where life is the worker's incarnation at the time (written by every
// heartbeat, in the same script as the heartbeat key). Instance IDs cannot
// contain braces (store.ValidateName), so the value parses back into the
// instance whose heartbeat says whether it lives, and the life a recoverer
// read under its claim. Every member reads such values (the sweep, the
// recovery by owner, Start's predecessor recovery) since the release
// before this one; owner-mode workers write them (Worker.OwnerValue), rows-set
// workers write bare instance IDs (the rolling upgrade of docs/safety.md
// §2).

// lifeWidth is how many characters a life adds to an instance ID in an
// owner value: the braces and an incarnation (newToken, 32 hex digits).
const lifeWidth = 2 + 32

// lifeOwner returns the owner value of one life of instance id.
func lifeOwner(id, life string) string { return id + "{" + life + "}" }

// parseOwner splits an owner value into its instance ID and life (empty for
// a bare instance ID). ok is false when v is neither a valid instance ID
// nor a valid per-life value.
func parseOwner(v string) (id, life string, ok bool) {
	i := strings.IndexByte(v, '{')
	if i < 0 {
		return v, "", store.ValidateName(v) == nil
	}
	id, life = v[:i], v[i+1:]
	if !strings.HasSuffix(life, "}") {
		return "", "", false
	}
	life = life[:len(life)-1]
	if store.ValidateName(id) != nil || store.ValidateName(life) != nil {
		return "", "", false
	}
	return id, life, true
}

// OwnerValue returns the value the host writes into the owner column when it
// takes rows, and matches in its completion guard:
//
//	UPDATE ... SET status = 'inprog', owner = $owner WHERE ...   -- the fetch
//	UPDATE ... SET status = 'done' WHERE id = $id AND owner = $owner AND status = 'inprog'
//
// Read it once per block, before the fetch, pass the same value to TrackAs,
// and use it for the completion of every row of the block. In owner mode
// it names the worker's current life, <instance ID>{<incarnation>}: a new
// life begins at Start, whenever the lease is lost, and before a heartbeat
// sent so late it could land on an expired key, so that a recovery of a
// life judged dead never reaches rows taken in a later one (docs/safety.md
// §2). In rows-set mode it is the instance ID (InstanceID).
func (w *Worker) OwnerValue() string {
	if !w.ownerMode {
		return w.opts.instanceID
	}
	life := w.rows.currentIncarnation()
	w.ownerRead.Store(&life) // what a plain Track takes (trackOwner)
	return lifeOwner(w.opts.instanceID, life)
}

// currentOwner is OwnerValue for the library's own use: it leaves alone the
// value a plain Track takes (trackOwner), which only the host's reads set.
func (w *Worker) currentOwner() string {
	if !w.ownerMode {
		return w.opts.instanceID
	}
	return lifeOwner(w.opts.instanceID, w.rows.currentIncarnation())
}

// trackOwner is the owner value a plain Track takes its rows for in owner
// mode: the value OwnerValue last returned, which a host that reads Owner once
// per block and then calls Track (the quickstart of the release before
// TrackAs) wrote in its fetch. Should a loss have begun a new life since,
// TrackAs refuses it as an ended life's. A host that never called OwnerValue
// gets the current life's value.
func (w *Worker) trackOwner() string {
	if p := w.ownerRead.Load(); p != nil && !mutantTrackCurrentLife {
		return lifeOwner(w.opts.instanceID, *p)
	}
	return w.currentOwner()
}
