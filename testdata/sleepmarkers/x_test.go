//go:build sim

package x

import "time"

func f() {
	time.Sleep(1) // pace: a host's work
	// fake clock: the next fault's instant,
	// in the bubble
	time.Sleep(2)
	time.Sleep(3)
	// real time: the snapshot's expiry
	time.Sleep(4)
	// a comment that names no kind
	time.Sleep(5)
	time.Sleep(6) // real time but no colon
}
