package pgcore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The chunk size: the probe before any rate is known, the fit to half the
// time left and half the statement_timeout, halving after a chunk that
// ran out of time, doubling after a full fast one, and no rate told by a
// chunk that found no rows (the reset of an owner with none left, which
// recovery runs before the one with the rows: taken for a rate, it made
// the next chunk the whole block again, and every try failed alike).
func TestChunkSizerFitsChunksToTheTimeLeftAndTheStatementTimeout(t *testing.T) {
	var c chunkSizer
	c.init(5000)
	assert.Equal(t, 5000, c.next(context.Background()), "no deadline, no statement_timeout: WithChunkSize")

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	assert.Equal(t, probeChunk, c.next(ctx), "under a deadline, before any rate: the probe")
	assert.Equal(t, 5000, c.statement(), "a statement in a transaction does not probe")

	c.done(ctx, 0, time.Millisecond)
	assert.Equal(t, probeChunk, c.next(ctx), "a chunk that found no rows tells no rate")

	c.done(ctx, probeChunk, 100*time.Millisecond) // 1 ms a row
	assert.Equal(t, 5000, c.next(ctx), "an hour left: the whole size")

	c.stmtTimeout.Store(100) // ms
	assert.Equal(t, 50, c.next(ctx), "half of 100 ms at 1 ms a row")
	assert.Equal(t, 50, c.statement(), "a statement in a transaction: the same")

	short, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	assert.LessOrEqual(t, c.next(short), 20, "half the 40 ms left at 1 ms a row")

	c.failed(50)
	assert.Equal(t, int64(25), c.size.Load(), "halved after a chunk that ran out of time")
	assert.Equal(t, 25, c.next(ctx), "and the rate taken as twice as slow: 50 ms / 2 ms")

	c.done(ctx, 0, time.Microsecond)
	assert.Equal(t, int64(25), c.size.Load(), "a chunk that found no rows does not grow the size")

	c.stmtTimeout.Store(0)
	c.done(ctx, 25, time.Millisecond) // far under a quarter of the budget
	assert.Equal(t, int64(50), c.size.Load(), "doubled after a full fast chunk")

	for range 20 {
		c.failed(1)
	}
	assert.Equal(t, 1, c.next(ctx), "never below one row")
}
