package main

import (
	"slices"
	"time"

	"github.com/safeack/safeack/frontier"
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
// commit that covers it: by offset (the committed offset passed it), and by
// offset or completed tail (safeack's tail in the commit metadata lists it,
// so a restart would not handle it again). Other clients' metadata is not
// decoded (Parallel Consumer keeps its own encoding there).
func coverLags(tr *ackTracker, t *topic, changes [][]commitChange) (byOffset, byTail lagStats) {
	np := len(changes)
	offAt := make([][]int64, np)  // per partition, per offset - offBase: first cover by offset (unix ns), 0 = never
	tailAt := make([][]int64, np) // same, by offset or tail
	for p := range np {
		n := int(t.ends[p] - t.offBase[p])
		if n < 0 {
			n = 0
		}
		offAt[p], tailAt[p] = make([]int64, n), make([]int64, n)
		base := t.offBase[p]
		next := int64(0) // offsets below base+next are covered by offset
		for _, c := range changes[p] {
			for ; next < int64(n) && base+next < c.off; next++ {
				offAt[p][next] = c.at
				if tailAt[p][next] == 0 {
					tailAt[p][next] = c.at
				}
			}
			if c.meta == "" {
				continue
			}
			tail, err := frontier.DecodeTail(c.meta, c.off)
			if err != nil {
				continue
			}
			for _, r := range tail.Ranges {
				for o := max(r.From, base); o < min(r.To, base+int64(n)); o++ {
					if i := o - base; tailAt[p][i] == 0 {
						tailAt[p][i] = c.at
					}
				}
			}
		}
	}
	offVals := make([]int64, 0, tr.n)
	tailVals := make([]int64, 0, tr.n)
	offMissing, tailMissing := 0, 0
	for i := range tr.n {
		a := tr.ackUnixNano(i)
		p, off := t.offsetOf(i)
		j := off - t.offBase[p]
		if a == 0 || j < 0 || j >= int64(len(offAt[p])) {
			offMissing++
			tailMissing++
			continue
		}
		// A commit seen before the ack was recorded: the ack's timestamp is
		// taken after the consumer learned of it (after m.Ack()), so a
		// commit can beat it by a hair.
		if at := offAt[p][j]; at != 0 {
			offVals = append(offVals, max(0, at-a))
		} else {
			offMissing++
		}
		if at := tailAt[p][j]; at != 0 {
			tailVals = append(tailVals, max(0, at-a))
		} else {
			tailMissing++
		}
	}
	return summarize(offVals, offMissing), summarize(tailVals, tailMissing)
}
