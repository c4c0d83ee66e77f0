package main

import (
	"slices"
	"time"
)

// lagStats summarises one duration per record.
type lagStats struct {
	n       int // records measured
	missing int // records without an end point (never covered by a commit)
	p50     time.Duration
	p99     time.Duration
	p999    time.Duration
	max     time.Duration
}

func (l lagStats) ok() bool { return l.n > 0 }

func summarize(vals []int64, missing int) lagStats {
	if len(vals) == 0 {
		return lagStats{missing: missing}
	}
	slices.Sort(vals)
	q := func(f float64) time.Duration {
		return time.Duration(vals[min(len(vals)-1, int(f*float64(len(vals))))])
	}
	return lagStats{n: len(vals), missing: missing, p50: q(0.50), p99: q(0.99), p999: q(0.999), max: time.Duration(vals[len(vals)-1])}
}

// coverLags is, per record, the time from its ack to the first observed
// commit past its offset.
func coverLags(tr *ackTracker, t *topic, changes [][]commitChange) lagStats {
	vals := make([]int64, 0, tr.n)
	missing := 0
	for i := range tr.n {
		a := tr.ackUnixNano(i)
		if a == 0 {
			missing++
			continue
		}
		p, off := t.offsetOf(i)
		at, ok := coveredAt(changes[p], off)
		if !ok {
			missing++
			continue
		}
		// A commit seen before the ack was recorded: the ack's timestamp is
		// taken after the consumer learned of it (after m.Ack()), so a
		// commit can beat it by a hair.
		vals = append(vals, max(0, at-a))
	}
	return summarize(vals, missing)
}
