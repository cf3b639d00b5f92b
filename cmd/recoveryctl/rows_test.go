package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/alya/recovery"
)

// A row left because another session held it locked is shown as such, in
// text and in JSON, not as a row of a misspelt status.
func TestRowsNotResetShowWhichAreLocked(t *testing.T) {
	rows := rowsJSON([]recovery.RowState{{ID: 3, Status: "inprog", Locked: true}, {ID: 4, Status: "running"}})
	assert.Equal(t, `row 3 status "inprog" (locked by another session), row 4 status "running"`, rowList(rows))
	b, err := json.Marshal(rows)
	require.NoError(t, err)
	assert.JSONEq(t, `[{"row_id":3,"status":"inprog","locked":true},{"row_id":4,"status":"running"}]`, string(b))
}

// A row the database refused to change (a BEFORE UPDATE trigger returning
// NULL) is shown as refused, not as locked, in text and in JSON.
func TestRowsNotResetShowWhichAreRefused(t *testing.T) {
	rows := rowsJSON([]recovery.RowState{{ID: 2, Status: "inprog", Refused: true}, {ID: 3, Status: "inprog", Locked: true}})
	assert.Equal(t, `row 2 status "inprog" (refused by the database: a trigger), row 3 status "inprog" (locked by another session)`, rowList(rows))
	b, err := json.Marshal(rows)
	require.NoError(t, err)
	assert.JSONEq(t, `[{"row_id":2,"status":"inprog","refused":true},{"row_id":3,"status":"inprog","locked":true}]`, string(b))
}
