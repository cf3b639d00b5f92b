//go:build simmutants

package recovery

// The simulation's mutants (see mutants_off.go): variables here, which
// sim_mutants_test.go turns on one at a time.
var (
	mutantNoStickyLease           bool
	mutantNoNodeAgeHold           bool
	mutantNoRegainHold            bool
	mutantReleaseUnrecorded       bool
	mutantNoFleetCheck            bool
	mutantOwnTimingsOnly          bool
	mutantNoEvictionHold          bool
	mutantOwnerByID               bool
	mutantOneLife                 bool
	mutantNoLateLife              bool
	mutantAbandonedFreeLease      bool
	mutantOwnLivesByMemory        bool
	mutantTrackCurrentLife        bool
	mutantMisspeltOnAnyChange     bool
	mutantUnboundedUnverifiedHold bool
	mutantSwappedBeatsInProgress  bool
	mutantAccuseUnregistered      bool
	mutantNoLifeListing           bool
	mutantWitnessNoGrace          bool
	mutantWitnessJudgesMass       bool
	mutantWitnessNoFence          bool

	mutantSweepOneLook     bool
	mutantSweepAnyNode     bool
	mutantSweepIgnoresSets bool
)
