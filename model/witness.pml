/*
 * The liveness witness (issue 34; witness.go, internal/store/witness.go;
 * docs/safety.md §14; docs/model.md, "witness.pml"), in owner mode with
 * per-life owner values.
 *
 * Each life of a worker holds a subscription to its own channel on a
 * connection of its own. The connection can be cut (the server closes it:
 * CLIENT KILL, a proxy, a partition noticed); the worker reconnects and
 * writes its marker (life, epoch) again, a new epoch, before a ping's
 * answer counts as proof. Its fence: Track (the fetch) and CheckLease
 * pass only while the last proof was sent at most F ticks ago. A judge
 * counts the subscribers of each marked life; a life absent at every
 * count for G ticks since its first absent count is judged: the marker
 * becomes "judged <life>" by compare-and-set on the value the judge read,
 * then the rows of that life are reset by owner value. A worker whose
 * marker write (after a reconnection) or renewal finds its life judged
 * ends that life.
 *
 * Time: a Tick process ages every timer by one; ages saturate, so the
 * state space is finite and the clock runs for ever. A pause is a process
 * taking no step while ticks pass. Every step is atomic.
 *
 * Scope: W workers (<= 2), NR rows (<= 2), one judge (the witness turn's
 * holder; the second is not modelled), CUTS connection cuts in all, each
 * worker may crash (its connection closes with it). The judge counts at
 * any time (no count-gap rule) and reads the markers at any time or not
 * at all, which only allows it more verdicts than the code's.
 *
 * Variants (spin -D...):
 *   (none)      the protocol: grace G > fence F, proof only after the
 *               epoch's marker, the compare-and-set, the mass rule
 *   NOGRACE     the judge judges at the first absent count
 *   NOFENCE     Track and CheckLease pass without a fresh proof
 *   NOCAS       the compare-and-set ignores the epoch (the marker still
 *               names the life): a blind verdict
 *   EARLYPROOF  a ping's answer counts as proof before the new epoch's
 *               marker is written
 *   NOMASS      no mass rule: more than K lives absent at one count are
 *               judged too
 *   -DMCUTS=1   (with W=2) a partition: one step cuts every live
 *               worker's connection at once
 *
 * m1 (the mass rule's purpose, availability: safety holds without it, by
 * the fence): a live life counted absent at a count that found more than
 * K lives absent is not judged before it is counted present again.
 *   -DG=1       grace equal to the fence (F = 1)
 */

#ifndef W
#define W 1
#endif
#ifndef NR
#define NR 1
#endif
#ifndef CUTS
#define CUTS 1
#endif
#ifndef F
#define F 1          /* the fence, in ticks */
#endif
#ifndef G
#define G 2          /* the grace, in ticks */
#endif
#ifndef K
#define K 1          /* mass rule: more than K lives absent at a count hold every verdict */
#endif
#ifndef MCUTS
#define MCUTS 0      /* partitions: every live connection cut at one step */
#endif
#define CAP (G + 1)  /* ages saturate: older is the same as CAP */
#define LMAX 3       /* lives per worker */

#define MAXW 2
#define MAXR 2
#define NONE 255

/* row statuses */
#define QUEUED 0
#define INPROG 1
#define DONE   2

/* owner values <id>{<life>}; markers "<life> <epoch>", "judged <life>" */
#define OV(s, l)    ((s) * 16 + (l))
#define MV(l, e)    ((l) * 8 + (e))
#define JV(l)       (64 + (l) * 8)
#define MLIFE(m)    (((m) % 64) / 8)
#define ISJUDGED(m) ((m) >= 64)

#define BIT(x)    (1 << (x))
#define HAS(m, x) ((((m) >> (x)) & 1) == 1)

/* PostgreSQL: the rows table */
byte st[MAXR];      /* status */
byte own[MAXR];     /* owner value */
byte ndone[MAXR];   /* ghost: committed completions */

/* Redis */
byte mrk[MAXW];     /* <id>_WITNESS: the marker */
bool conn[MAXW];    /* the worker's pub/sub connection is open on the server */
byte clife[MAXW];   /* the life whose channel that connection subscribes */

/* each worker */
bool alive[MAXW];
byte life[MAXW];    /* its current life */
byte ep[MAXW];      /* its connection's epoch (the last marker written) */
bool mk[MAXW];      /* its marker is written for the current connection */
byte pg[MAXW];      /* a ping: 0 none, 1 sent, 2 answered (reply on its way) */
byte pe[MAXW];      /* the epoch the ping was sent in */
bool pm[MAXW];      /* it was sent after that epoch's marker */
byte page[MAXW];    /* ticks since the ping was sent */
byte pfa[MAXW];     /* ticks since the last proof's ping was sent */
byte tk[MAXW];      /* the row the host tracks, or NONE */
byte tv[MAXW];      /* the life it was tracked under */
bool cur[MAXW];     /* the host passed CheckLease for it and processes it */
byte jl[MAXW];      /* ghost: lives judged, a bit mask */

/* the judge */
byte jv[MAXW];      /* the marker it read, or NONE (not watched) */
byte ja[MAXW];      /* ticks since the first absent count, or NONE */
bool jm[MAXW];      /* absent in a mass disappearance: held */
byte jdue;          /* lives due for a verdict, a bit mask */
byte jr;            /* lives judged, rows not yet reset, a bit mask */
byte jrl[MAXW];     /* the life judged */

byte cuts = CUTS;
byte mcuts = MCUTS;
bool massed[MAXW];  /* ghost: counted absent in a mass disappearance, not present since */

bool s1_live_owner_reset, s2_done_twice, w1_judged_life_works, m1_mass_verdict;

#ifdef NOFENCE
#define FRESH(s) (alive[s])
#else
#define FRESH(s) (alive[s] && pfa[s] <= F)
#endif
#ifdef EARLYPROOF
#define PROOF(s) (pe[s] == ep[s])
#else
#define PROOF(s) (pe[s] == ep[s] && pm[s] && mk[s])
#endif
#ifdef NOCAS
#define CASOK(s) (MLIFE(mrk[s]) == MLIFE(jv[s]))
#else
#define CASOK(s) (mrk[s] == jv[s] || mrk[s] == JV(MLIFE(jv[s])))
#endif
/* the channel of life l has a subscriber */
#define PRESENT(s, l) (conn[s] && clife[s] == (l))

#define PICKW(g, v, C) if :: (g) && C(0) -> v = 0 :: (g) && W > 1 && C(1) -> v = 1 fi
#define PICKR(g, v, C) if :: (g) && C(0) -> v = 0 :: (g) && NR > 1 && C(1) -> v = 1 fi
#define QUEUEDROW(x) (st[x] == QUEUED)

/*
 * s1: no row is reset while its owner's life is the worker's current one,
 * the worker alive and its fence passing (its CheckLease would pass).
 * me: the worker releasing its own row, NONE for the judge.
 */
inline reset_row(x, v, me) {
	if
	:: st[x] == INPROG && own[x] == v ->
		if
		:: me == NONE && alive[v / 16] && life[v / 16] == v % 16 && FRESH(v / 16) -> s1_live_owner_reset = 1
		:: else
		fi;
		assert(!s1_live_owner_reset);
		st[x] = QUEUED;
		own[x] = NONE
	:: else
	fi
}

/* w1: Track and CheckLease never pass in a judged life */
#define W1(s) if :: HAS(jl[s], life[s]) -> w1_judged_life_works = 1 :: else fi; assert(!w1_judged_life_works)

/* the marker write or renewal found the life judged: the life ends (a
 * lease loss), the subscription moves to the new life's channel */
inline end_life(s) {
	life[s]++;
	assert(life[s] < LMAX);
	clife[s] = life[s];
	mk[s] = 0;
	printf("MSC: W%d finds its life judged: new life %d\n", s, life[s])
}

proctype Worker(byte s) {
	byte x;
end:
	do
	/* the witness */
	:: atomic { alive[s] && conn[s] && pg[s] == 0 -> pg[s] = 1; pe[s] = ep[s]; pm[s] = mk[s]; page[s] = 0 }
	:: atomic { conn[s] && pg[s] == 1 -> pg[s] = 2 }   /* the server answers */
	:: atomic {
		alive[s] && pg[s] == 2 ->
		if
		:: PROOF(s) && page[s] < pfa[s] -> pfa[s] = page[s]; printf("MSC: W%d proof (sent %d ago)\n", s, page[s])
		:: else
		fi;
		pg[s] = 0
	}
	/* reconnect (go-redis subscribes again): no proof until the marker */
	:: atomic { alive[s] && !conn[s] -> conn[s] = 1; clife[s] = life[s]; mk[s] = 0; pg[s] = 0; printf("MSC: W%d reconnects\n", s) }
	/* the marker of a new epoch (LifeHeld, then WriteWitness) */
	:: atomic {
		alive[s] && !mk[s] && PRESENT(s, life[s]) ->
		if
		:: mrk[s] == JV(life[s]) -> end_life(s)
		:: else -> ep[s]++; assert(ep[s] < 8); mrk[s] = MV(life[s], ep[s]); mk[s] = 1; printf("MSC: W%d marks life %d epoch %d\n", s, life[s], ep[s])
		fi
	}
	/* the marker's renewal */
	:: atomic { alive[s] && mk[s] && mrk[s] == JV(life[s]) -> end_life(s) }
	/* the host: fetch with Track (fenced) */
	:: atomic {
		PICKR(alive[s] && tk[s] == NONE && FRESH(s), x, QUEUEDROW);
		W1(s);
		st[x] = INPROG;
		own[x] = OV(s, life[s]);
		tk[s] = x;
		tv[s] = life[s];
		printf("MSC: W%d fetches row %d as %d{%d}\n", s, x, s, life[s]);
		x = 0
	}
	/* CheckLease (fenced), then the row is processed */
	:: atomic { tk[s] != NONE && !cur[s] && tv[s] == life[s] && FRESH(s) -> W1(s); cur[s] = 1; printf("MSC: W%d CheckLease passes, processes row %d\n", s, tk[s]) }
	/* the guarded completion (not fenced) */
	:: atomic {
		cur[s] ->
		x = tk[s];
		if
		:: st[x] == INPROG && own[x] == OV(s, tv[s]) ->
			st[x] = DONE;
			ndone[x]++;
			if :: ndone[x] > 1 -> s2_done_twice = 1 :: else fi;
			assert(!s2_done_twice)
		:: else
		fi;
		printf("MSC: W%d completes row %d: status %d\n", s, x, st[x]);
		tk[s] = NONE;
		cur[s] = 0;
		x = 0
	}
	/* the life ended: Release the row tracked in it */
	:: atomic { tk[s] != NONE && !cur[s] && tv[s] != life[s] -> reset_row(tk[s], OV(s, tv[s]), s); tk[s] = NONE }
	:: atomic {
		alive[s] ->
		alive[s] = 0;
		conn[s] = 0;
		pg[s] = 0;
		tk[s] = NONE;
		cur[s] = 0;
		printf("MSC: W%d crashes\n", s)
	};
		break
	od
}

#define LIVEW(s) (alive[s] && conn[s])

/* time, and the cuts */
proctype Net() {
	byte s, i;
end:
	do
	:: atomic {
		i = 0;
		do
		:: i < W ->
			if :: pfa[i] < CAP -> pfa[i]++ :: else fi;
			if :: pg[i] != 0 && page[i] < CAP -> page[i]++ :: else fi;
			if :: ja[i] != NONE && ja[i] < CAP -> ja[i]++ :: else fi;
			i++
		:: else -> break
		od;
		i = 0
	}
	/* the server closes a connection: a ping not yet answered is lost */
	:: atomic {
		PICKW(cuts > 0, s, LIVEW);
		cuts--;
		conn[s] = 0;
		if :: pg[s] == 1 -> pg[s] = 0 :: else fi;
		printf("MSC: W%d's connection is cut\n", s);
		s = 0
	}
	/* a partition: every worker's connection closed at one step */
	:: atomic {
		mcuts > 0 && W == 2 && LIVEW(0) && LIVEW(1) ->
		mcuts--;
		s = 0;
		do
		:: s < W ->
			conn[s] = 0;
			if :: pg[s] == 1 -> pg[s] = 0 :: else fi;
			s++
		:: else -> break
		od;
		printf("MSC: a partition cuts every connection\n");
		s = 0
	}
	od
}

#define DUE(s) (jdue != 0 && HAS(jdue, s))
#define REST(s) (jr != 0 && HAS(jr, s))

/* the witness turn's holder: read the markers (or not), count, judge */
proctype Judge() {
	byte s, absent;
end:
	do
	:: atomic {
		/* readMarkers (not between a count and its verdicts): a life
		 * marked the same keeps its count */
		jdue == 0 ->
		s = 0;
		do
		:: s < W ->
			if
			:: ISJUDGED(mrk[s]) -> jv[s] = NONE; ja[s] = NONE; jm[s] = 0
			:: !ISJUDGED(mrk[s]) && mrk[s] != jv[s] -> jv[s] = mrk[s]; ja[s] = NONE; jm[s] = 0
			:: else
			fi;
			s++
		:: else -> break
		od;
		s = 0
	}
	:: atomic {
		/* a count of the watched lives' subscribers */
		jdue == 0 && jr == 0 ->
		s = 0;
		do
		:: s < W && jv[s] == NONE -> s++
		:: s < W && jv[s] != NONE ->
			if
			:: PRESENT(s, MLIFE(jv[s])) -> ja[s] = NONE; jm[s] = 0; massed[s] = 0
			:: else ->
				if
				:: ja[s] == NONE -> ja[s] = 0; printf("MSC: J counts W%d's life %d absent\n", s, MLIFE(jv[s]))
#ifdef NOGRACE
					; jdue = jdue | BIT(s)
#endif
				:: ja[s] != NONE && !jm[s] && ja[s] >= G -> jdue = jdue | BIT(s)
				:: else
				fi
			fi;
			s++
		:: else -> break
		od;
		absent = 0;
		s = 0;
		do
		:: s < W -> if :: ja[s] != NONE && !jm[s] -> absent++ :: else fi; s++
		:: else -> break
		od;
		if
		:: absent > K ->
			s = 0;
			do
			:: s < W -> if :: ja[s] != NONE -> massed[s] = 1 :: else fi; s++
			:: else -> break
			od
		:: else
		fi;
#ifndef NOMASS
		if
		:: absent > K ->
			s = 0;
			do
			:: s < W -> if :: ja[s] != NONE -> jm[s] = 1 :: else fi; s++
			:: else -> break
			od;
			jdue = 0;
			printf("MSC: J: a mass disappearance, verdicts held\n")
		:: else
		fi;
#endif
		s = 0;
		absent = 0
	}
	/* JudgeLife: compare-and-set on the marker read */
	:: atomic {
		PICKW(jdue != 0, s, DUE);
		jdue = jdue & ~BIT(s);
		if
		:: CASOK(s) ->
			/* m1 */
			if :: alive[s] && life[s] == MLIFE(jv[s]) && massed[s] -> m1_mass_verdict = 1 :: else fi;
			assert(!m1_mass_verdict);
			mrk[s] = JV(MLIFE(jv[s]));
			jl[s] = jl[s] | BIT(MLIFE(jv[s]));
			jr = jr | BIT(s);
			jrl[s] = MLIFE(jv[s]);
			printf("MSC: J judges W%d's life %d\n", s, jrl[s])
		:: else -> printf("MSC: J's compare-and-set on W%d fails\n", s)
		fi;
		jv[s] = NONE;
		ja[s] = NONE;
		jm[s] = 0;
		s = 0
	}
	/* the reset of the judged life's rows, by owner value */
	:: atomic {
		PICKW(jr != 0, s, REST);
		jr = jr & ~BIT(s);
		printf("MSC: J resets the rows of %d{%d}\n", s, jrl[s]);
		absent = 0;
		do
		:: absent < NR -> reset_row(absent, OV(s, jrl[s]), NONE); absent++
		:: else -> break
		od;
		absent = 0;
		s = 0
	}
	od
}

init {
	byte i;
	atomic {
		i = 0;
		do
		:: i < MAXR -> if :: i < NR -> st[i] = QUEUED :: else -> st[i] = DONE fi; own[i] = NONE; i++
		:: else -> break
		od;
		i = 0;
		do
		:: i < MAXW ->
			jv[i] = NONE;
			ja[i] = NONE;
			tk[i] = NONE;
			if
			:: i < W ->
				/* established at Start: subscribed, marked, one proof */
				alive[i] = 1;
				conn[i] = 1;
				ep[i] = 1;
				mk[i] = 1;
				mrk[i] = MV(0, 1);
				pfa[i] = 0;
				run Worker(i)
			:: else
			fi;
			i++
		:: else -> break
		od;
		run Net();
		run Judge()
	}
}
