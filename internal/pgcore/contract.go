package pgcore

import "github.com/alya/recovery/internal/contract"

// The contract's types and errors, under the names the resetter's code
// has always used.
type (
	// ResetRequest is contract.ResetRequest.
	ResetRequest = contract.ResetRequest
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
