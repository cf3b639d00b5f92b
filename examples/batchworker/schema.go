package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// schemaSQL is the host schema of the design, with the columns crash
// recovery relies on:
//
//   - status: queued -> inprog -> done or failed. Recovery sets inprog rows
//     of a dead worker back to queued.
//   - owner: the instance ID of the worker that took the row. Completion is
//     guarded by it, so a worker that was presumed dead (and whose rows were
//     recovered and taken by a peer) cannot commit a second result; and a
//     reset only touches rows the dead worker still owns.
//   - recoveries: how often recovery (or Release) returned the row to the
//     queue; at maxRecoveries the row is set to failed instead.
//
// For an existing table the migration is:
//
//	ALTER TABLE batchrows ADD COLUMN owner text;
//	ALTER TABLE batchrows ADD COLUMN recoveries int NOT NULL DEFAULT 0;
//	CREATE INDEX batchrows_inprog_owner ON batchrows (owner, rowid) WHERE status = 'inprog';
const schemaSQL = `
CREATE TABLE IF NOT EXISTS batches (
	batchid bigint PRIMARY KEY,
	status  text NOT NULL DEFAULT 'inprog' -- wait, inprog, done
);
CREATE TABLE IF NOT EXISTS batchrows (
	rowid      bigint PRIMARY KEY,
	batchid    bigint NOT NULL REFERENCES batches,
	status     text   NOT NULL DEFAULT 'queued', -- queued, inprog, done, failed
	owner      text,
	recoveries int    NOT NULL DEFAULT 0,
	payload    text   NOT NULL DEFAULT '',
	result     text
);
CREATE INDEX IF NOT EXISTS batchrows_queued ON batchrows (rowid) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS batchrows_inprog_owner ON batchrows (owner, rowid) WHERE status = 'inprog';
`

// createSchema creates the tables if they do not exist.
func createSchema(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

// seedBatch inserts a new batch of n queued rows and returns its ID.
func seedBatch(ctx context.Context, pool *pgxpool.Pool, n int) (batchID int64, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx,
			`INSERT INTO batches (batchid) SELECT coalesce(max(batchid), 0) + 1 FROM batches RETURNING batchid`,
		).Scan(&batchID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO batchrows (rowid, batchid, payload)
			SELECT base + g, $1, 'row ' || (base + g)
			FROM generate_series(1, $2::bigint) g,
			     (SELECT coalesce(max(rowid), 0) AS base FROM batchrows) b`, batchID, n)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("seed a batch of %d rows: %w", n, err)
	}
	return batchID, nil
}
