package pgcore

import "github.com/alya/recovery/internal/contract"

// The contract's types and errors, under the names the resetter's code
// has always used.
type (
	// RowsReset is contract.RowsReset.
	RowsReset = contract.RowsReset
	// OwnerReset is contract.OwnerReset.
	OwnerReset = contract.OwnerReset
	// VersionsReset is contract.VersionsReset.
	VersionsReset = contract.VersionsReset
	// PlanRequest is contract.PlanRequest.
	PlanRequest = contract.PlanRequest
	// ResetResult is contract.ResetResult.
	ResetResult = contract.ResetResult
	// RowState is contract.RowState.
	RowState = contract.RowState
	// ResetterInfo is contract.ResetterInfo.
	ResetterInfo = contract.ResetterInfo
)

// The contract's errors.
var (
	ErrInvalidConfig = contract.ErrInvalidConfig
	ErrSchema        = contract.ErrSchema
	ErrReadOnly      = contract.ErrReadOnly
	ErrRowsLocked    = contract.ErrRowsLocked
	ErrPoolExhausted = contract.ErrPoolExhausted
	ErrRowsRefused   = contract.ErrRowsRefused
)
