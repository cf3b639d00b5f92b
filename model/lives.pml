/*
 * Owner mode with per-life owner values (issue 22; docs/safety.md §2,
 * "Per-life owner values"; docs/model.md, "Per-life owner values"): a
 * model of the recovery by owner, in which every worker writes the owner
 * value <id>{<life>} and a recovery resets only the rows of the life it
 * read under its claim. recovery.pml models rows-set mode with owner
 * fencing; this model has no rows sets: a worker's rows are found by their
 * owner value, as owner mode finds them.
 *
 * Scope: W instance IDs (<= 2), one recoverer, NR rows (<= 2). Process
 * slot s < W runs instance ID s from the start; with RESTART, slot W is a
 * second process of ID 0, started once slot 0's heartbeat key has expired
 * (slot 0 paused or crashed), as a pod restarted under a fixed ID is.
 * Every step is one atomic action; a process can stop between any two
 * steps (a crash, a pause), and the clocks run in between.
 *
 * Protocol variants (spin -D...):
 *   (none)      the design: a life per worker; a new life at Start,
 *               whenever the worker notes a lost lease (at a heartbeat's
 *               send, or at its answer when that comes after the lease
 *               ended), and before a heartbeat sent so late that it may
 *               land on an expired key; no hold after a regained lease; a
 *               recovery resets the life it read under its claim (read,
 *               then the claim sent again); Release resets each row under
 *               the value it was tracked with
 *   IDONLY      the mutant of issue 22: every reset (a recovery, Start's,
 *               Release) matches the instance ID only, so reaches every life
 *   BAREID      workers write bare instance IDs (every life is 0): the
 *               release before per-life values; with HOLD it is that release
 *   HOLD        the hold after a regained lease (hole H1's fix): the
 *               worker takes no rows until every recovery that may have
 *               claimed it while it was away has ended, that is, passed its
 *               reset or outlived its claim TTL
 *   NOANSWERLIFE  an answer after the lease ended notes the loss without a
 *               new life (the heartbeat carried a life begun at its send)
 *   NOLATELIFE  no new life before a late heartbeat
 *   OWNERREAD   the host reads Owner() for its next block some time before
 *               the fetch; Track refuses a value that is not the current life
 *   TRACKANYVALUE  with OWNERREAD: Track accepts a value of an ended life
 *   NOCONFIRM   the recovery resets the life it read without claiming again
 *   NOBEATCANCEL  the heartbeat does not cancel a recoverer's claim
 * Scenario switches:
 *   SWEEP       the recoverer may also be the sweep: it lists the owner
 *               values of an ID in progress (at any time), later judges
 *               the ID dead, and its reset adds the lives it listed
 *   LATECOMMIT  R1 of docs/safety.md §12: a reset whose recoverer's context
 *               ended (its claim TTL passed) may still commit; without it
 *               the context's end rolls the reset back
 *   RESTART     R2: a second process of ID 0 starts while the first is
 *               paused past its TTL; Start recovers its predecessor under
 *               the claim on its own ID first
 *   CHUNKS      R3: the reset by owner is one statement per row (keyset
 *               chunks, READ COMMITTED: each statement sees rows committed
 *               before it), so it is still running while the worker
 *               resumes and fetches; with NR=2 (and LATECOMMIT: a reset
 *               within its claim TTL is covered by the hold)
 * Faults are bounded so that every check is exhaustive: FAULTS claim TTLs
 * that pass while the recoverer is at work, PAUSES lease losses (a pause or
 * a Redis outage: the lease runs into its last operation timeout, then
 * ends); each worker may also crash, for good.
 */

#ifndef W
#define W 2
#endif
#ifndef NR
#define NR 1
#endif
#ifndef FAULTS
#define FAULTS 1
#endif
#ifndef PAUSES
#define PAUSES 1
#endif
#ifdef RESTART
#define S (W + 1)    /* slot W: a second process of ID 0 */
#else
#define S W
#endif

#define MAX 3        /* array sizes; unused rows start DONE and stay so */
#define NOBODY 255   /* no owner, no row, no slot, no token */
#define SID(s) ((s) < W -> (s) : 0)   /* slot W runs ID 0 */

/* row statuses */
#define QUEUED 0
#define INPROG 1
#define DONE   2

/* owner values: instance ID and life; with BAREID every life is 0 */
#define OV(i, l) ((i) * 16 + (l))
#define OID(v)   ((v) / 16)

/* lease phases: valid; valid but in its last operation timeout (a
 * heartbeat sent now may be answered after it ends, and land on an
 * expired key); ended */
#define OK    0
#define LATE  1
#define ENDED 2

/* recoverer phases */
#define IDLE    0
#define CLAIM   1
#define READ    2
#define CONFIRM 3
#define RESET   4
#define FIN     5
#define LISTED  6   /* SWEEP: owner values listed, no verdict yet */

/* Start phases of a restarted process (RESTART, slot W) */
#define SWAIT   0
#define SREAD   1
#define SRESET  2
#define SBEAT   3
#define SUP     4

#define BIT(x)    (1 << (x))
#define HAS(m, x) ((((m) >> (x)) & 1) == 1)

/* PostgreSQL: the rows table */
byte st[MAX];       /* status column */
byte own[MAX];      /* owner column */
byte lk[MAX];       /* locked by an open fetch transaction: its slot */
byte ndone[MAX];    /* ghost: committed completions of the row */
byte holder[MAX];   /* ghost: the slot whose fetch committed the row last */

/* Redis */
byte hb[W];         /* <id>_HEARTBEAT: the slot + 1 whose token it holds; 0 absent */
byte inc[W];        /* <id>_INCARNATION: the life the last heartbeat wrote */
byte ck[W];         /* <id>_RECOVERY: the claim's token, or NOBODY (absent) */
byte nl[W];         /* lives are random tokens: the next unused one */

/* each process's memory and lease */
bool alive[S];
byte lp[S];         /* lease phase */
byte life[S];       /* the life its fetches write */
byte trk[S];        /* rows tracked, a bit mask */
byte stale[S];      /* rows tracked when the loss was noted */
byte tv[S * MAX];   /* tv[s*MAX+x]: the owner value row x was tracked under */
bool ousted[S];     /* a heartbeat found another process's token: lost for good */
bool bf[S];         /* a heartbeat in flight */
byte bl[S];         /* the life it carries */
byte bs[S];         /* the lease phase when it was sent */
bool hold[S];       /* HOLD: a regained lease held */

/* the recoverer (one) and, with RESTART, slot W's Start */
byte ph;            /* phase */
byte rp;            /* the peer it recovers */
byte seen;          /* the life it read under its claim */
byte rx;            /* CHUNKS: the next row its reset reaches */
byte lst;           /* SWEEP: the lives of rp it listed in progress, a bit mask */
bool cexp;          /* its context has ended (claim TTL passed) */
byte sph;           /* slot W's Start phase */
byte sseen;         /* the predecessor's life Start read */
#define RTOK 1
#define STOK 2

byte faults = FAULTS;
byte pauses = PAUSES;

#define PICK(g, v, C) if :: (g) && C(0) -> v = 0 :: (g) && C(1) -> v = 1 :: (g) && C(2) -> v = 2 fi

/* CheckLease (and Track): the lease holds, no row tracked at the loss is
 * left, the ID is ours, and (HOLD) no regain is held */
#ifdef HOLD
#define LEASEOK(s) (alive[s] && lp[s] != ENDED && stale[s] == 0 && !ousted[s] && !hold[s])
#else
#define LEASEOK(s) (alive[s] && lp[s] != ENDED && stale[s] == 0 && !ousted[s])
#endif

/* a new life (a new random incarnation token) */
#ifdef BAREID
#define NEWLIFE(s) skip
#else
#define NEWLIFE(s) life[s] = nl[SID(s)]; nl[SID(s)]++; assert(life[s] < 8)   /* lst's bits */
#endif

/* what a reset of owner value v matches */
#ifdef IDONLY
#define MATCH(x, v) (OID(own[x]) == OID(v))
#else
#define MATCH(x, v) (own[x] == (v))
#endif
/* what the recovery's reset matches: the life read under the claim and
 * (SWEEP) the lives the sweep listed in progress */
#ifdef SWEEP
#define RMATCH(x) (MATCH(x, OV(rp, seen)) || (OID(own[x]) == rp && HAS(lst, own[x] % 16)))
#else
#define RMATCH(x) MATCH(x, OV(rp, seen))
#endif

bool s1_live_owner_reset, s2_done_twice, s5_taken_twice;

/*
 * Safety 1: no row is reset while the process whose fetch committed it is
 * alive, its CheckLease passes and the row is not stale (tracked when a
 * loss was noted: the host has been told). me is the slot releasing its
 * own rows, NOBODY for a recovery.
 */
#define LIVEHOLDER(x, me) (holder[x] != NOBODY && holder[x] != me && LEASEOK(holder[x]) && !HAS(stale[holder[x]], x))
inline reset_row(x, M, me) {
	if
	:: st[x] == INPROG && M ->
		if :: LIVEHOLDER(x, me) -> s1_live_owner_reset = 1 :: else fi;
		assert(!s1_live_owner_reset);
		st[x] = QUEUED;
		own[x] = NOBODY;
		holder[x] = NOBODY
	:: else
	fi
}

/* UPDATE ... SET status = queued, owner = NULL WHERE <M: the owner values> AND status = inprog */
inline reset_owner(M) {
	x = 0;
	do
	:: x < NR -> reset_row(x, M, NOBODY); x++
	:: else -> x = 0; break
	od
}

/*
 * The heartbeat, sent and answered in two steps. At the send the loop
 * notes a lost lease (rows tracked become stale, a new life); a heartbeat
 * sent in the lease's last operation timeout begins a new life first. The
 * answer: Beat writes the heartbeat, the incarnation (the life it carries)
 * and cancels a recoverer's claim, unless the key holds another
 * process's token; the lease is renewed from the send time. An answer
 * after the lease ended notes the loss (the key may have expired on the
 * way and a recoverer claimed this worker).
 */
inline send(s) {
	if
	:: lp[s] == ENDED -> stale[s] = trk[s]; NEWLIFE(s)
#ifndef NOLATELIFE
	:: lp[s] == LATE -> NEWLIFE(s)
#endif
	:: else
	fi;
	bf[s] = 1;
	bl[s] = life[s];
	bs[s] = lp[s]
}

inline land(s) {
	if
	:: hb[SID(s)] != 0 && hb[SID(s)] != s + 1 ->
		ousted[s] = 1;
		lp[s] = ENDED;
		stale[s] = trk[s]
	:: else ->
		hb[SID(s)] = s + 1;
		inc[SID(s)] = bl[s];
#ifndef NOBEATCANCEL
		ck[SID(s)] = NOBODY;
#endif
		if
		:: lp[s] == ENDED ->
			stale[s] = trk[s];
#ifndef NOANSWERLIFE
			/* the loss is noted here (not at the send): a new life */
			if :: bs[s] != ENDED -> NEWLIFE(s) :: else fi;
#endif
#ifdef HOLD
			hold[s] = 1;
#endif
			skip
		:: else
		fi;
		lp[s] = OK
	fi;
	bf[s] = 0;
	bl[s] = 0;
	bs[s] = 0
}

#define QUEUEDFREE(x) (x < NR && st[x] == QUEUED && lk[x] == NOBODY)
#define TRACKED(x)    (x < NR && HAS(trk[s], x))
#define IDLEHOST      (fl == NOBODY && cur == NOBODY && fin == NOBODY)

/*
 * A process of instance ID SID(s): heartbeat, and the host loop (fetch a
 * row with Track inside the fetch transaction, process after CheckLease,
 * complete with the guard, Untrack; Release rows when CheckLease fails).
 */
proctype Worker(byte s) {
	byte x, fl = NOBODY, cur = NOBODY, fin = NOBODY;
#ifdef OWNERREAD
	byte ow = NOBODY;   /* the value the host read for its next block */
#endif
#ifdef RESTART
	/* Start of a second process of ID 0 (slot W): the first's key has expired;
	 * Start recovers its predecessor under the claim on its own ID (it
	 * waits while a peer holds it), then its first heartbeat */
	if
	:: s == W ->
		atomic { hb[0] == 0 && ck[0] == NOBODY -> ck[0] = STOK; sph = SREAD; printf("MSC: the second process of ID 0 starts: claims its own ID\n") };
		atomic {
			if
			:: hb[0] == 0 && (ck[0] == STOK || ck[0] == NOBODY) -> ck[0] = STOK; sseen = inc[0]; sph = SRESET
			:: else -> sph = SUP; printf("MSC: its Start: ID 0 is back, refused\n"); goto gone
			fi
		};
		atomic { printf("MSC: its Start resets its predecessor's life %d\n", sseen); reset_owner(MATCH(x, OV(0, sseen))); sph = SBEAT };
		atomic {
			if :: ck[0] == STOK -> ck[0] = NOBODY :: else fi;
			sph = SUP;
			if
			:: hb[0] == 0 ->
				NEWLIFE(s);
				hb[0] = s + 1;
				inc[0] = life[s];
				lp[s] = OK;
				alive[s] = 1;
				printf("MSC: its first heartbeat: life %d\n", life[s])
			:: else -> printf("MSC: its Start is refused: ID 0 in use\n"); goto gone
			fi
		}
	:: else
	fi;
#endif
end:
	do
	:: atomic { !bf[s] && !ousted[s] -> send(s); printf("MSC: P%d heartbeat sent (lease %d), life %d\n", s, bs[s], bl[s]) }
	:: atomic { bf[s] -> land(s); printf("MSC: P%d heartbeat answered: ousted %d, hb %d, life %d, stale %d\n", s, ousted[s], hb[SID(s)], life[s], stale[s]) }
	/* fetchBlock: SELECT ... FOR UPDATE SKIP LOCKED, UPDATE ... owner =
	 * Owner(), Track(that value) ... */
#ifdef OWNERREAD
	/* the host reads Owner() for its next block, some time before the
	 * fetch; Track refuses a value that is not the current life */
	:: atomic { IDLEHOST && ow == NOBODY -> ow = OV(SID(s), life[s]); printf("MSC: P%d host reads Owner(): %d{%d}\n", s, SID(s), life[s]) }
#ifdef TRACKANYVALUE
#define OWNER ow
#define TRACKS (ow != NOBODY)
#else
#define OWNER ow
#define TRACKS (ow == OV(SID(s), life[s]))
#endif
#else
#define OWNER OV(SID(s), life[s])
#define TRACKS true
#endif
	:: atomic {
		PICK(IDLEHOST && LEASEOK(s) && TRACKS, x, QUEUEDFREE);
		lk[x] = s;
		trk[s] = trk[s] | BIT(x);
		tv[s * MAX + x] = OWNER;
		fl = x;
		printf("MSC: P%d fetch row %d as %d{%d} (locked, tracked)\n", s, x, OID(OWNER), OWNER % 16);
#ifdef OWNERREAD
		ow = NOBODY;
#endif
		x = 0
	}
	/* ... COMMIT */
	:: atomic {
		fl != NOBODY ->
		st[fl] = INPROG;
		own[fl] = tv[s * MAX + fl];
		holder[fl] = s;
		lk[fl] = NOBODY;
		printf("MSC: P%d fetch COMMIT: row %d inprog, owner %d{%d}\n", s, fl, OID(own[fl]), own[fl] % 16);
		fl = NOBODY
	}
	/* processBlock: CheckLease before each row */
	:: atomic {
		PICK(IDLEHOST && LEASEOK(s), x, TRACKED);
		cur = x;
		printf("MSC: P%d CheckLease ok, processes row %d\n", s, x);
		x = 0
	}
	/* complete: UPDATE ... SET status = done WHERE owner = <value of the block> AND status = inprog */
	:: atomic {
		cur != NOBODY ->
		if
		:: st[cur] == INPROG && own[cur] == tv[s * MAX + cur] ->
			st[cur] = DONE;
			ndone[cur]++;
			if :: ndone[cur] > 1 -> s2_done_twice = 1 :: else fi;
			assert(!s2_done_twice);
			/* Safety 5: the completion is the fetch's that committed the
			 * row last: no row taken again is completed by its old holder */
			if :: holder[cur] != s -> s5_taken_twice = 1 :: else fi;
			assert(!s5_taken_twice)
		:: else
		fi;
		printf("MSC: P%d completes row %d as %d{%d}: status %d\n", s, cur, OID(tv[s * MAX + cur]), tv[s * MAX + cur] % 16, st[cur]);
		fin = cur;
		cur = NOBODY
	}
	:: atomic { fin != NOBODY -> trk[s] = trk[s] & ~BIT(fin); stale[s] = stale[s] & ~BIT(fin); fin = NOBODY }
	/* Release: the reset under the value the row was tracked in, then Untrack */
	:: atomic {
		PICK(IDLEHOST && !LEASEOK(s), x, TRACKED);
		printf("MSC: P%d lease lost: Release row %d (owner %d{%d})\n", s, x, OID(tv[s * MAX + x]), tv[s * MAX + x] % 16);
		reset_row(x, MATCH(x, tv[s * MAX + x]), s);
		fin = x;
		x = 0
	}
	:: atomic {
		alive[s] ->
		alive[s] = 0;
		lp[s] = ENDED;
		if :: fl != NOBODY -> lk[fl] = NOBODY :: else fi;
		trk[s] = 0;
		stale[s] = 0;
		bf[s] = 0;
		printf("MSC: P%d crashes\n", s)
	};
		break
	od;
#ifdef RESTART
gone:
#endif
	skip
}

/* a recovery that may still reset rows of ID i: claimed (or about to) and
 * neither past its reset nor past its claim TTL; Start's recovery too */
#ifdef RESTART
#define BUSY(i) ((rp == i && ph >= CLAIM && ph <= RESET && !cexp) || (i == 0 && sph >= SREAD && sph <= SRESET))
#else
#define BUSY(i) (rp == i && ph >= CLAIM && ph <= RESET && !cexp)
#endif

/*
 * Time for one process's lease and key. The lease runs into its last
 * operation timeout (a pause, a Redis outage: counted), then ends; not
 * while a heartbeat sent before that is in flight (it is answered before
 * the lease ends). The key expires only after the lease has ended.
 */
proctype Clock(byte s) {
end:
	do
	:: atomic { alive[s] && lp[s] == OK && pauses > 0 -> pauses--; lp[s] = LATE; printf("MSC: P%d pauses: its lease is in its last operation timeout\n", s) }
	:: atomic { lp[s] == LATE && !(bf[s] && bs[s] == OK) -> lp[s] = ENDED; printf("MSC: P%d lease ends\n", s) }
	:: atomic { lp[s] == ENDED && hb[SID(s)] == s + 1 -> hb[SID(s)] = 0; printf("MSC: ID %d heartbeat key expires\n", SID(s)) }
#ifdef HOLD
	:: atomic { hold[s] && !BUSY(SID(s)) -> hold[s] = 0; printf("MSC: P%d hold ends\n", s) }
#endif
	od
}

/* scripts.Claim on ID p with token t: taken unless the heartbeat is there
 * or another token holds the claim */
#define CLAIMABLE(p, t) (hb[p] == 0 && (ck[p] == NOBODY || ck[p] == t))
#define DEADID(p) (p < W && hb[p] == 0)
#define IDLE_AGAIN ph = IDLE; rp = 0; seen = 0; rx = 0; cexp = 0; lst = 0
/* SWEEP: an owner value of ID p in progress (a life to list) */
#define LISTABLE(p) (p < W && ((st[0] == INPROG && OID(own[0]) == p) || (st[1] == INPROG && OID(own[1]) == p)))
#define LIFEOF(x) (st[x] == INPROG && OID(own[x]) == rp -> BIT(own[x] % 16) : 0)

/*
 * A recoverer: scan (any ID whose heartbeat is absent: the registry's
 * scan, or the sweep's verdict), claim, read the incarnation, claim again
 * (still ours: the life read is the one judged dead), reset that life,
 * finish. The claim TTL may pass at any step (a fault): the context ends,
 * the claim key expires; the next Redis call fails. With LATECOMMIT a reset
 * already sent may still commit.
 */
proctype Recoverer() {
	byte x;
end:
	do
#ifdef SWEEP
	/* the sweep lists the owner values in progress (at any time, the
	 * owner alive or not), then judges the instance by its heartbeat */
	:: atomic {
		PICK(ph == IDLE, rp, LISTABLE);
		lst = LIFEOF(0) | LIFEOF(1);
		ph = LISTED;
		printf("MSC: R sweep lists ID %d's lives in progress: %d\n", rp, lst)
	}
	:: atomic { ph == LISTED && hb[rp] == 0 -> ph = CLAIM; printf("MSC: R sweep: ID %d heartbeat absent\n", rp) }
	:: atomic { ph == LISTED -> IDLE_AGAIN }
#endif
	:: atomic { PICK(ph == IDLE, rp, DEADID); ph = CLAIM; printf("MSC: R scan: ID %d heartbeat absent\n", rp) }
	:: atomic {
		ph == CLAIM && !cexp ->
		if
		:: CLAIMABLE(rp, RTOK) -> ck[rp] = RTOK; ph = READ; printf("MSC: R claims ID %d\n", rp)
		:: else -> printf("MSC: R claim of ID %d refused\n", rp); IDLE_AGAIN
		fi
	}
#ifdef NOCONFIRM
	:: atomic { ph == READ && !cexp -> seen = inc[rp]; ph = RESET; printf("MSC: R reads ID %d's life: %d\n", rp, seen) }
#else
	:: atomic { ph == READ && !cexp -> seen = inc[rp]; ph = CONFIRM; printf("MSC: R reads ID %d's life: %d\n", rp, seen) }
#endif
	:: atomic {
		ph == CONFIRM && !cexp ->
		if
		:: CLAIMABLE(rp, RTOK) -> ck[rp] = RTOK; ph = RESET; printf("MSC: R claims ID %d again: still ours\n", rp)
		:: else -> printf("MSC: R claims ID %d again: it came back\n", rp); IDLE_AGAIN
		fi
	}
#ifdef CHUNKS
	:: atomic {
		ph == RESET && rx < NR ->
		printf("MSC: R reset statement reaches row %d (owner %d{%d}, lives listed %d)\n", rx, rp, seen, lst);
		reset_row(rx, RMATCH(rx), NOBODY);
		rx++
	}
	:: atomic { ph == RESET && rx >= NR -> rx = 0; ph = FIN; printf("MSC: R reset COMMIT\n") }
#else
	:: atomic { ph == RESET -> printf("MSC: R reset of %d{%d} and lives listed %d (COMMIT)\n", rp, seen, lst); reset_owner(RMATCH(x)); ph = FIN }
#endif
	:: atomic {
		ph == FIN ->
		if :: !cexp && ck[rp] == RTOK -> ck[rp] = NOBODY :: else fi;
		printf("MSC: R finish ID %d\n", rp);
		IDLE_AGAIN
	}
	/* the claim TTL passes: the context ends, the claim key expires */
	:: atomic {
		ph >= CLAIM && ph <= RESET && !cexp && faults > 0 ->
		faults--;
		cexp = 1;
		if :: ck[rp] == RTOK -> ck[rp] = NOBODY :: else fi;
		printf("MSC: R's claim TTL passes (phase %d)\n", ph);
#ifdef LATECOMMIT
		if :: ph != RESET -> IDLE_AGAIN :: else fi
#else
		IDLE_AGAIN
#endif
	}
	od
}

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
			holder[i] = NOBODY;
			i++
		:: else -> break
		od;
		i = 0;
		do
		:: i < W -> ck[i] = NOBODY; hb[i] = i + 1; inc[i] = 0; nl[i] = 1; i++
		:: else -> break
		od;
		i = 0;
		do
		:: i < S ->
			if
			:: i < W -> alive[i] = 1; lp[i] = OK
			:: else -> lp[i] = ENDED
			fi;
			life[i] = 0;
			run Worker(i);
			run Clock(i);
			i++
		:: else -> break
		od;
		run Recoverer()
	}
}
