// Package ops is for operators and their tools (recoveryctl): reading a
// fleet's state in Redis (Inspect, InspectInstance, ReadTrackedRows), its
// recovery history (ReadHistory), planning and running a recovery now
// (PlanRecovery, RecoverNow) and the configuration from the environment
// (FromEnv). A worker author needs none of it.
package ops
