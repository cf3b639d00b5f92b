// Package report holds the report types a recovery builds (RecoveryReport,
// PeerRecovery, PeerError, RecoveryPlan, PeerPlan, PlanAction): the root
// package builds them and package ops aliases them.
package report
