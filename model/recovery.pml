/*
 * A model of the recovery protocol of github.com/alya/recovery, as the code
 * implements it with owner fencing (PgxResetter WithOwnerColumn, the host's
 * guarded completion). docs/model.md maps every step to the function that
 * implements it and says what is abstracted away.
 *
 * Scope (macros): W workers (<= 3), R recoverers (<= 3), NR rows (<= 3).
 * Every step is one atomic action; a process can stop between any two
 * (a crash, a pause) and the clocks below run in between.
 *
 * Variants (spin -D...): each removes one piece of the protocol and must
 * make a check fail (scripts/model.sh checks that it does).
 *   NOCLAIM       the design's original sequence: no claim; scan, read the
 *                 rows set, reset, delete the set, deregister
 *   NOOWNER       the reset without its owner guard (status guard only)
 *   NOSTATUS      the reset without its status guard (owner guard only)
 *   NOBEATCANCEL  the heartbeat does not cancel a recoverer's claim
 *   TRACKAFTER    the host tracks its rows after the fetch COMMIT
 *   NORECHECK     the deregistration does not re-check the heartbeat
 * HOLD models a fix of hole H1 (docs/model.md): a worker whose lease came
 * back takes no new rows (CheckLease fails) for a claim TTL, until every
 * recoverer that may have claimed it while it was away is past its reset. ATOMICDEREG models a fix of
 * hole H2: the deregistration removes the peer only if its heartbeat and
 * its rows set are both absent, in one step. BEATLOST models a fix of hole H3: the
 * heartbeat cancels a 'lost:' claim too. NOLIVEOWNER leaves Safety 1 unchecked and
 * NOREGISTRYCHECK Safety 4, to check the rest of the protocol as it is
 * today.
 * Faults are bounded so that every check is exhaustive in its scope:
 * FAULTS recoverer crashes, failures and claim expiries, PAUSES worker
 * pauses (lease losses); worker crashes are not bounded (each worker
 * crashes at most once, for good). LIVE builds the liveness check (the
 * LTL property below, with -a -f).
 */

#ifndef W
#define W 2
#endif
#ifndef R
#define R 2
#endif
#ifndef NR
#define NR 2
#endif
#ifndef FAULTS
#define FAULTS 2
#endif
#ifndef PAUSES
#define PAUSES 2
#endif

#define MAX 3        /* array sizes; unused rows start DONE and stay so */
#define NOBODY 7     /* no owner, no row, no token */

/* row statuses */
#define QUEUED 0
#define INPROG 1
#define DONE   2

/* claim key ALYA_{id}_RECOVERY: its kind, and its token in ct[] */
#define FREE   0     /* absent */
#define HELD   1     /* a recoverer's token */
#define LOSTC  2     /* 'lost:' .. token */
#define FAILED 3     /* the failure note */
#define DONE1  4     /* tombstone 'done:1:' .. token */
#define DONE2  5     /* tombstone 'done:2:' .. token */

/* recoverer phases */
#define IDLE    0
#define CLAIM   1
#define READ    2
#define RESET   3
#define FIN     4
#define DEREG   5
#define RECHECK 6

#define BIT(x)    (1 << (x))
#define HAS(m, x) ((((m) >> (x)) & 1) == 1)

/* PostgreSQL: the rows table */
byte st[MAX];       /* status column */
byte own[MAX];      /* owner column */
byte lk[MAX];       /* locked by an open fetch transaction (FOR UPDATE) */
byte ndone[MAX];    /* ghost: committed completions of the row */

/* Redis */
bool hb[MAX];       /* ALYA_{w}_HEARTBEAT exists */
byte rs[MAX];       /* ALYA_{w}_ROWS, a bit mask; 0: the key is absent */
byte reg;           /* ALYA_WORKER_REGISTRY, a bit mask */
byte ck[MAX];       /* ALYA_{w}_RECOVERY: kind */
byte ct[MAX];       /* ALYA_{w}_RECOVERY: token */

/* each worker's memory and lease */
bool dead[MAX];
bool lease[MAX];    /* the lease (last heartbeat's send + TTL - TTL/10) */
byte trk[MAX];      /* inflight: rows tracked */
byte stale[MAX];    /* rows tracked when the lease was lost */

/* recoverers: the current token and phase, and whether its context has ended */
byte rtok[MAX];
byte rph[MAX];
byte rpeer[MAX];
bool cexp[MAX];

/* HOLD: the worker's lease came back, and a recoverer may still act on its rows */
bool hold[MAX];
#define BUSYON(r, w) (r < R && rpeer[r] == w && rph[r] >= CLAIM && rph[r] <= RESET)

/* fault budgets, so that the search is exhaustive in a bounded scope:
 * recoverer crashes, failures and claim expiries; worker pauses */
byte faults = FAULTS;
byte pauses = PAUSES;
#define FAULT  (faults > 0)
#define SPEND  faults--

/* choose v among 0..2 with C(v) and the guard g; the first statement of
 * its atomic block, so the block is enabled only if some v qualifies */
#define PICK(g, v, C) if :: (g) && C(0) -> v = 0 :: (g) && C(1) -> v = 1 :: (g) && C(2) -> v = 2 fi

/* CheckLease: the lease holds and no row tracked at its loss is left */
#ifdef HOLD
#define LEASEOK(w) (lease[w] && stale[w] == 0 && !hold[w])
#else
#define LEASEOK(w) (lease[w] && stale[w] == 0)
#endif

/* The reset's guards (resetQuery in pgx_sql.go). */
#if defined(NOSTATUS)
#define GUARD(x, p) (own[x] == p)
#elif defined(NOOWNER)
#define GUARD(x, p) (st[x] == INPROG)
#else
#define GUARD(x, p) (st[x] == INPROG && own[x] == p)
#endif

/*
 * Safety 1: no row is reset while the worker holding it is alive, holds a
 * valid lease and was not told the row may be gone (a stale row). me is
 * the worker releasing its own rows, or NOBODY for a recoverer.
 */
#define LIVEHOLDER(x, me) (own[x] < W && own[x] != me && !dead[own[x]] && LEASEOK(own[x]))
/* the properties' names, for the report of a violated assertion */
bool s1_live_owner_reset, s2_done_twice, s3_row_not_in_set, s4_owner_not_registered;

#ifdef NOLIVEOWNER
#define CHECK_LIVE(x, me) skip
#else
#define CHECK_LIVE(x, me) if :: LIVEHOLDER(x, me) -> s1_live_owner_reset = 1 :: else fi; assert(!s1_live_owner_reset)
#endif

inline reset_row(x, p, me) {
	if
	:: GUARD(x, p) ->
		CHECK_LIVE(x, me);
		st[x] = QUEUED;
		own[x] = NOBODY
	:: else
	fi
}

/* one of the rows of m is locked by an open fetch transaction */
#define LOCKEDIN(m) ((HAS(m, 0) && lk[0] != NOBODY) || (HAS(m, 1) && lk[1] != NOBODY) || (HAS(m, 2) && lk[2] != NOBODY))

/* the reset statement over a set of rows (PgxResetter.ResetIncarnation) */
inline reset_rows(m, p) {
	x = 0;
	do
	:: x < NR -> if :: HAS(m, x) -> reset_row(x, p, NOBODY) :: else fi; x++
	:: else -> x = 0; break
	od
}

/*
 * Beat (internal/scripts): noteLeaseLoss first marks the rows tracked at
 * the loss stale (owner fencing), then the script sets the heartbeat,
 * cancels a recoverer's claim, writes back every tracked row, and the
 * pipeline's SADD registers the worker; the lease is renewed.
 */
inline beat(w) {
	if
	:: !lease[w] ->
		stale[w] = trk[w];
#ifdef HOLD
		hold[w] = 1;
#endif
		skip
	:: else
	fi;
	hb[w] = 1;
#ifndef NOBEATCANCEL
	if
#ifdef BEATLOST
	:: ck[w] == HELD || ck[w] == LOSTC ->
#else
	:: ck[w] == HELD ->
#endif
		ck[w] = FREE;
		ct[w] = NOBODY
	:: else
	fi;
#endif
	rs[w] = rs[w] | trk[w];
	reg = reg | BIT(w);
	lease[w] = 1
}

/* Untrack: memory and SREM (the rows-set lock makes them one step for the heartbeat) */
inline untrack(w, x) {
	trk[w] = trk[w] & ~BIT(x);
	stale[w] = stale[w] & ~BIT(x);
	rs[w] = rs[w] & ~BIT(x)
}

#define QUEUEDFREE(x) (x < NR && st[x] == QUEUED && lk[x] == NOBODY)
#define TRACKED(x)    (x < NR && HAS(trk[w], x))

/*
 * A worker: its heartbeat loop and its host loop (fetch a row, process,
 * complete with the guard, Untrack; Release the rows when CheckLease
 * fails), one row at a time, any number of rows tracked. It may crash
 * between any two steps.
 */
proctype Worker(byte w) {
	byte x, fl = NOBODY, cur = NOBODY, fin = NOBODY, ta = NOBODY;
end:
	do
	:: atomic { beat(w); printf("MSC: W%d heartbeat (Beat): rows set %d, claim cancelled if held\n", w, rs[w]) }
	/* fetchBlock: SELECT ... FOR UPDATE SKIP LOCKED, UPDATE, Track, ... */
	:: atomic {
		PICK(fl == NOBODY && cur == NOBODY && fin == NOBODY && ta == NOBODY && LEASEOK(w), x, QUEUEDFREE);
		lk[x] = w;
#ifndef TRACKAFTER
		trk[w] = trk[w] | BIT(x);
		rs[w] = rs[w] | BIT(x);
#endif
		fl = x;
		printf("MSC: W%d fetch row %d (locked, tracked, not committed)\n", w, x);
		x = 0
	}
	/* ... COMMIT */
	:: atomic {
		fl != NOBODY ->
		st[fl] = INPROG;
		own[fl] = w;
		lk[fl] = NOBODY;
		printf("MSC: W%d fetch COMMIT: row %d inprog, owner W%d\n", w, fl, w);
#ifdef TRACKAFTER
		ta = fl;
#endif
		fl = NOBODY
	}
#ifdef TRACKAFTER
	:: atomic { ta != NOBODY -> trk[w] = trk[w] | BIT(ta); rs[w] = rs[w] | BIT(ta); ta = NOBODY }
#endif
	/* processBlock: CheckLease before each row */
	:: atomic {
		PICK(fl == NOBODY && cur == NOBODY && fin == NOBODY && ta == NOBODY && LEASEOK(w), x, TRACKED);
		cur = x;
		printf("MSC: W%d CheckLease ok, processes row %d\n", w, x);
		x = 0
	}
	/* complete: UPDATE ... SET status = done WHERE owner = me AND status = inprog */
	:: atomic {
		cur != NOBODY ->
		if
		:: st[cur] == INPROG && own[cur] == w ->
			st[cur] = DONE;
			ndone[cur]++;
			/* Safety 2: no row done twice */
			if :: ndone[cur] > 1 -> s2_done_twice = 1 :: else fi;
			assert(!s2_done_twice)
		:: else    /* not ours any more: the result is discarded */
		fi;
		printf("MSC: W%d completes row %d: status %d owner %d (done count %d)\n", w, cur, st[cur], own[cur], ndone[cur]);
		fin = cur;
		cur = NOBODY
	}
	:: atomic { fin != NOBODY -> untrack(w, fin); printf("MSC: W%d Untrack row %d\n", w, fin); fin = NOBODY }
	/* giveBack: Release, the reset under the worker's own ID, then Untrack */
	:: atomic {
		PICK(fl == NOBODY && cur == NOBODY && fin == NOBODY && ta == NOBODY && !LEASEOK(w), x, TRACKED);
		reset_row(x, w, w);
		printf("MSC: W%d lease lost: Release row %d\n", w, x);
		fin = x;
		x = 0
	}
	/* crash: memory is gone, an open transaction rolls back */
	:: atomic {
		!dead[w] ->
		dead[w] = 1;
		lease[w] = 0;
		if
		:: fl != NOBODY -> lk[fl] = NOBODY
		:: else
		fi;
		trk[w] = 0;
		stale[w] = 0;
		printf("MSC: W%d crashes\n", w)
	};
		break
	od
}

/*
 * Time for one worker's keys. The lease may end at any moment (a pause, a
 * Redis outage); the heartbeat key expires only after the lease ended
 * (the lease ends TTL/10 before the key can expire). Rows sets are not
 * expired: their TTL outlives every recovery attempt (docs/model.md).
 */
proctype Clock(byte w) {
end:
	do
	:: atomic { lease[w] && !dead[w] && pauses > 0 -> pauses--; lease[w] = 0; printf("MSC: W%d pauses: its lease ends\n", w) }
	:: atomic { !lease[w] && hb[w] -> hb[w] = 0; printf("MSC: W%d heartbeat key expires\n", w) }
#ifdef HOLD
	/* a claim TTL after the lease came back: every recoverer that may
	 * have claimed this worker while it was away is past its reset */
	:: atomic { hold[w] && !BUSYON(0, w) && !BUSYON(1, w) && !BUSYON(2, w) -> hold[w] = 0 }
#endif
	od
}

/* a claim whose recoverer is still at work on it: its expiry ends that
 * recoverer's context, which counts as a fault */
#define ACTIVE(p) ((ck[p] == HELD || ck[p] == LOSTC) && rtok[ct[p] / 2] == ct[p])
/* a tombstone outlives the retries of its Finish (2 x the operation timeout) */
#define RETRYING(p) ((ck[p] == DONE1 || ck[p] == DONE2) && rtok[ct[p] / 2] == ct[p] && rph[ct[p] / 2] == FIN)
#define CLAIMED(p) (p < W && ck[p] != FREE && (FAULT || !ACTIVE(p)) && !RETRYING(p))

/*
 * Time for the claim keys. A recoverer's claim expires when its context
 * has ended (claim TTL): the recoverer's next Redis call fails, but a
 * reset already sent may still commit (a late COMMIT). Failure notes
 * expire at any time, tombstones once their Finish is no longer retried.
 */
proctype ClaimClock() {
	byte p, h;
end:
	do
	:: atomic {
		PICK(true, p, CLAIMED);
		if
		:: ACTIVE(p) ->
			SPEND;
			h = ct[p] / 2;
			cexp[h] = 1
		:: else
		fi;
		printf("MSC: claim key of W%d expires (kind %d)\n", p, ck[p]);
		ck[p] = FREE;
		ct[p] = NOBODY;
		p = 0;
		h = 0
	}
	od
}

/* scripts.Claim; res: 1 taken, 2 taken without record, 3 taken and lost, 0 alive, 4 held */
inline claim(p, tok, res) {
	if
	:: hb[p] -> res = 0
	:: else ->
		failed = 0;
		res = 1;
		if
		:: (ck[p] == HELD || ck[p] == LOSTC) && ct[p] == tok -> skip    /* a retry of our own call */
		:: ck[p] == FAILED -> failed = 1
		:: ck[p] == FREE -> skip
		:: else -> res = 4
		fi;
		if
		:: res == 4
		:: res != 4 && rs[p] != 0 -> ck[p] = HELD; ct[p] = tok; res = 1
		:: res != 4 && rs[p] == 0 && (failed || (ck[p] == LOSTC && ct[p] == tok)) ->
			ck[p] = LOSTC; ct[p] = tok; res = 3
		:: else -> ck[p] = HELD; ct[p] = tok; res = 2
		fi
	fi
}

/* scripts.Finish; res: 1 done, 2 the peer is back, 0 the claim was lost */
inline finish(p, tok, res) {
	if
	:: (ck[p] == HELD || ck[p] == LOSTC) && ct[p] == tok ->
		res = 2;
		if
		:: !hb[p] -> rs[p] = 0; res = 1
		:: else
		fi;
		if
		:: res == 1 -> ck[p] = DONE1
		:: else -> ck[p] = DONE2
		fi;
		ct[p] = tok
	:: ck[p] == DONE1 && ct[p] == tok -> res = 1
	:: ck[p] == DONE2 && ct[p] == tok -> res = 2
	:: else -> res = 0
	fi
}

/* scripts.Fail (releaseClaim) */
inline fail(p, tok) {
	if
	:: (ck[p] == HELD || ck[p] == LOSTC) && ct[p] == tok -> ck[p] = FAILED; ct[p] = NOBODY
	:: else
	fi
}

/* a scan's verdict: registered, heartbeat absent */
#define DEADPEER(p) (p < W && HAS(reg, p) && !hb[p])
/* a claim key holding token t (tokens are random: a new one is never an old one) */
#define USES(p, t) (p < W && ck[p] != FREE && ck[p] != FAILED && ct[p] == t)
#define TOKFREE(t) (!USES(0, t) && !USES(1, t) && !USES(2, t))

/*
 * A recoverer: recoverPeer for one dead peer at a time. It may stop
 * between any two steps (a crash, or its context ending), leaving Redis
 * and the table as they are.
 */
/* back to idle, forgetting the attempt (so that it leaves no state behind) */
#define IDLE_AGAIN ph = IDLE; rpeer[me] = 0; seen = 0; res = 0; tok = 0; retried = 0; failed = 0; rtok[me] = NOBODY; cexp[me] = 0
#define ph rph[me]
#define p rpeer[me]
proctype Recoverer(byte me) {
	byte x, tok, seen, res;
	bool g, retried, failed;
end:
	do
	/* scan: SMEMBERS registry, EXISTS heartbeat */
	:: atomic {
		PICK(ph == IDLE && TOKFREE(me * 2 + (1 - g)), p, DEADPEER);
		g = 1 - g;
		tok = me * 2 + g;
		rtok[me] = tok;
		cexp[me] = 0;
		retried = 0;
		printf("MSC: R%d scan: W%d registered, heartbeat absent\n", me, p);
#ifdef NOCLAIM
		ph = READ
#else
		ph = CLAIM
#endif
	}
	:: atomic {
		ph == CLAIM ->
		claim(p, tok, res);
		printf("MSC: R%d Claim W%d token %d: result %d (1 taken, 2 no record, 3 lost, 0 alive, 4 held)\n", me, p, tok, res);
		if
		:: !retried -> retried = 1    /* the reply was lost: go-redis runs it again */
		:: true ->
			retried = 0;
			if
			:: res == 1 || res == 2 -> ph = READ
			:: res == 3 -> ph = FIN
			:: else -> IDLE_AGAIN
			fi
		fi
	}
	/* readRows */
	:: atomic {
		ph == READ ->
		if
		:: cexp[me] -> fail(p, tok); IDLE_AGAIN
		:: else -> seen = rs[p]; printf("MSC: R%d reads the rows set of W%d: %d\n", me, p, seen); ph = RESET
		fi
	}
	/* the reset transaction; FOR UPDATE waits for a fetch transaction that
	 * holds one of the rows; it may commit after the claim expired */
	:: atomic { ph == RESET && !LOCKEDIN(seen) -> printf("MSC: R%d reset rows %d of W%d (COMMIT)\n", me, seen, p); reset_rows(seen, p); ph = FIN }
	/* PostgreSQL or Redis failed: releaseClaim leaves the failure note */
	:: atomic { (ph == READ || ph == RESET) && FAULT -> SPEND; fail(p, tok); printf("MSC: R%d fails: Fail note on W%d\n", me, p); IDLE_AGAIN }
	:: atomic {
		ph == FIN ->
#ifdef NOCLAIM
		rs[p] = 0;
		printf("MSC: R%d deletes the rows set of W%d\n", me, p);
		ph = DEREG
#else
		if
		:: cexp[me] -> IDLE_AGAIN
		:: else ->
			finish(p, tok, res);
			printf("MSC: R%d Finish W%d: result %d (1 done, 2 back, 0 lost)\n", me, p, res);
			if
			:: !retried -> retried = 1
			:: true ->
				retried = 0;
				if
				:: res == 1 -> ph = DEREG
				:: else -> IDLE_AGAIN
				fi
			fi
		fi
#endif
	}
	/* deregister: SREM, then re-check the heartbeat and SADD back */
	:: atomic {
		ph == DEREG ->
#ifdef ATOMICDEREG
		if
		:: !hb[p] && rs[p] == 0 -> reg = reg & ~BIT(p)
		:: else
		fi;
#else
		reg = reg & ~BIT(p);
#endif
		printf("MSC: R%d SREM registry W%d\n", me, p);
#ifdef NORECHECK
		IDLE_AGAIN
#else
		ph = RECHECK
#endif
	}
	:: atomic {
		ph == RECHECK ->
		if
		:: hb[p] -> reg = reg | BIT(p); printf("MSC: R%d W%d is back: SADD registry\n", me, p)
		:: else
		fi;
		IDLE_AGAIN
	}
	/* a crash (and restart) or an ended context */
	:: atomic { ph != IDLE && FAULT -> SPEND; printf("MSC: R%d crashes (phase %d)\n", me, ph); IDLE_AGAIN }
	od
}
#undef ph
#undef p

/*
 * Safety 3: every row in progress under a dead worker is in the worker's
 * rows set. A row that is not can never be found by a recoverer.
 * Safety 4: and the dead worker is registered, or a recoverer is about to
 * register it again (its deregistration re-checks the heartbeat): the scan
 * only looks at registered workers.
 */
#define DEADROW(x) (x < NR && st[x] == INPROG && own[x] < W && dead[own[x]])
#define NOTINSET(x) (DEADROW(x) && !HAS(rs[own[x]], x))
#define REREG(r, w) (r < R && rpeer[r] == w && (rph[r] == DEREG || (rph[r] == RECHECK && hb[w])))
#define NOTREG(x) (DEADROW(x) && !HAS(reg, own[x]) && \
	!REREG(0, own[x]) && !REREG(1, own[x]) && !REREG(2, own[x]))

#ifndef LIVE
active proctype Safety3() {
end:
	atomic { (NOTINSET(0) || NOTINSET(1) || NOTINSET(2)) -> s3_row_not_in_set = 1; assert(!s3_row_not_in_set) }
}
#ifndef NOREGISTRYCHECK
active proctype Safety4() {
end:
	atomic { (NOTREG(0) || NOTREG(1) || NOTREG(2)) -> s4_owner_not_registered = 1; assert(!s4_owner_not_registered) }
}
#endif
#endif

/*
 * Liveness: a row in progress under a dead worker is eventually queued
 * (checked for worker 0 and row 0; workers and rows are symmetric).
 */
#define HELD00 (st[0] == INPROG && own[0] == 0)
#ifdef LIVE
ltl queued { [] ((dead[0] && HELD00) -> <> !HELD00) }
#endif

init {
	byte i;
	atomic {
		i = 0;
		do
		:: i < MAX ->
			if
			:: i < NR -> st[i] = QUEUED
			:: else -> st[i] = DONE
			fi;
			own[i] = NOBODY;
			lk[i] = NOBODY;
			ct[i] = NOBODY;
			rtok[i] = NOBODY;
			i++
		:: else -> break
		od;
		i = 0;
		do
		:: i < W -> hb[i] = 1; lease[i] = 1; reg = reg | BIT(i); i++
		:: else -> break
		od;
		i = 0;
		do
		:: i < W -> run Worker(i); run Clock(i); i++
		:: else -> break
		od;
		run ClaimClock();
		i = 0;
		do
		:: i < R -> run Recoverer(i); i++
		:: else -> break
		od
	}
}
