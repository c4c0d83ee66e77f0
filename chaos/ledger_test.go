//go:build chaos

package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// po names one record: partition and offset.
type po struct {
	p int32
	o int64
}

func (k po) String() string { return fmt.Sprintf("%d@%d", k.p, k.o) }

// event is one handler event of one consumer (a process or a member).
type event struct {
	consumer int
	seq      uint64 // orders the events of one consumer
	kind     byte   // 'S' handler started, 'A' acked, 'N' nacked
	p        int32
	o        int64
	key      string    // "" for a record without a key
	assign   uint64    // 'S': the consumer's assignment number of the partition
	at       time.Time // 'A': just before Ack
}

// ledger is the scenario's ack log: every handler event of every consumer.
type ledger struct {
	mu       sync.Mutex
	seq      uint64 // for in-process members
	events   []event
	acks     map[po]int
	firstAck map[po]time.Time
	nacks    int
	// floor is, per partition, where the group started: the records
	// below it are history, produced before the group joined at
	// OffsetNewest, that no consumer may handle and no commit may go
	// below. Empty at OffsetOldest: every partition starts at 0.
	floor map[int32]int64
}

func newLedger() *ledger {
	return &ledger{acks: make(map[po]int), firstAck: make(map[po]time.Time)}
}

// record adds an in-process event, numbered by the ledger.
func (l *ledger) record(e event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	e.seq = l.seq
	l.addLocked(e)
}

// add adds an event numbered by its consumer.
func (l *ledger) add(e event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addLocked(e)
}

func (l *ledger) addLocked(e event) {
	l.events = append(l.events, e)
	switch e.kind {
	case 'A':
		k := po{e.p, e.o}
		l.acks[k]++
		if first, ok := l.firstAck[k]; !ok || e.at.Before(first) {
			l.firstAck[k] = e.at
		}
	case 'N':
		l.nacks++
	}
}

// setFloor sets where the group started on each partition (see floor).
func (l *ledger) setFloor(floor map[int32]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.floor = maps.Clone(floor)
}

// floorOf returns where the group started on partition p. Callers hold mu.
func (l *ledger) floorOf(p int32) int64 { return l.floor[p] }

// deliveredFrom reports whether every partition of floor had a handler
// start at or above its floor.
func (l *ledger) deliveredFrom(floor map[int32]int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := make(map[int32]bool, len(floor))
	for _, e := range l.events {
		if f, ok := floor[e.p]; ok && e.kind == 'S' && e.o >= f {
			seen[e.p] = true
		}
	}
	return len(seen) == len(floor)
}

// missing returns the records of [floor, end) per partition without an
// ack.
func (l *ledger) missing(end map[int32]int64) []po {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []po
	for p, e := range end {
		for o := l.floorOf(p); o < e; o++ {
			if l.acks[po{p, o}] == 0 {
				out = append(out, po{p, o})
			}
		}
	}
	slices.SortFunc(out, func(a, b po) int { return cmp.Or(cmp.Compare(a.p, b.p), cmp.Compare(a.o, b.o)) })
	return out
}

// commitView is one committed state to check: an OffsetCommit request the
// embedded broker received, or committed offsets polled from the broker.
type commitView struct {
	source  string // "request #n gen g member m" or "poll"
	at      time.Time
	gen     int32
	offsets map[int32]kafkatest.CommittedOffset
}

// verdict collects invariant violations, keeping the first few messages.
type verdict struct {
	n    int
	msgs []string
}

func (v *verdict) add(format string, args ...any) {
	v.n++
	if len(v.msgs) < 25 {
		v.msgs = append(v.msgs, fmt.Sprintf(format, args...))
	}
}

// checkCommits checks invariant 1 over every commit: each record from the
// partition's floor up to a committed offset was acked before the commit
// was made, and each record the completed tail in its metadata claims was
// too; and invariant 8: no commit is below the floor, where the group
// started. end is the end of every partition.
func (l *ledger) checkCommits(v *verdict, views []commitView, end map[int32]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// prefix[p][c] is the latest first-ack time of the records in
	// [floor, c), and hole[p] the first record from the floor never acked
	// (or end).
	prefix := make(map[int32][]time.Time, len(end))
	hole := make(map[int32]int64, len(end))
	for p, e := range end {
		pm := make([]time.Time, e+1)
		hole[p] = e
		for o := l.floorOf(p); o < e; o++ {
			a, ok := l.firstAck[po{p, o}]
			if !ok && hole[p] == e {
				hole[p] = o
			}
			pm[o+1] = pm[o]
			if a.After(pm[o]) {
				pm[o+1] = a
			}
		}
		prefix[p] = pm
	}
	for _, c := range views {
		for p, co := range c.offsets {
			if co.Offset < 0 {
				continue
			}
			e, known := end[p]
			switch {
			case !known:
				v.add("%s: commit of unknown partition %d", c.source, p)
				continue
			case co.Offset > e:
				v.add("%s: partition %d committed %d, past the end of the log %d", c.source, p, co.Offset, e)
				continue
			case co.Offset < l.floorOf(p):
				v.add("%s: partition %d committed %d, below where the group started (%d)", c.source, p, co.Offset, l.floorOf(p))
				continue
			case co.Offset > hole[p]:
				v.add("%s: partition %d committed %d, past record %v which was never acked", c.source, p, co.Offset, po{p, hole[p]})
				continue
			case !prefix[p][co.Offset].Before(c.at):
				for o := l.floorOf(p); o < co.Offset; o++ {
					if a := l.firstAck[po{p, o}]; !a.Before(c.at) {
						v.add("%s at %s: partition %d committed %d, past record %v first acked %v later",
							c.source, c.at.Format("15:04:05.000000"), p, co.Offset, po{p, o}, a.Sub(c.at))
						break
					}
				}
				continue
			}
			tail, err := frontier.DecodeTail(co.Metadata, co.Offset)
			if err != nil {
				v.add("%s: partition %d committed %d with metadata that does not decode as a tail: %v", c.source, p, co.Offset, err)
				continue
			}
		ranges:
			for _, r := range tail.Ranges {
				for o := r.From; o < r.To && o < e; o++ {
					a, ok := l.firstAck[po{p, o}]
					if !ok || !a.Before(c.at) {
						v.add("%s: partition %d committed %d with a tail claiming %v completed, which was not acked then (acked: %v)",
							c.source, p, co.Offset, po{p, o}, ok)
						break ranges
					}
				}
			}
		}
	}
}

// checkHistory checks that no consumer handled a record below its
// partition's floor: history the group, joining at OffsetNewest, must never
// see. It reports each such record once.
func (l *ledger) checkHistory(v *verdict) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.floor) == 0 {
		return
	}
	seen := make(map[po]bool)
	for _, e := range l.events {
		k := po{e.p, e.o}
		if e.o < l.floorOf(e.p) && !seen[k] {
			seen[k] = true
			v.add("consumer %d handled record %v, below where the group started (%d): history produced before it joined at OffsetNewest",
				e.consumer, k, l.floorOf(e.p))
		}
	}
}

// checkKeyOrder checks invariant 6 over each consumer's events: two records
// of a key never run at the same time, and within one assignment the
// records of a key start in offset order (a nacked record starts again at
// the same offset). Key-less records count as one key per partition: under
// OrderByKey they run one at a time in their partition, as in
// watermill-kafka. It returns how many starts it checked.
func (l *ledger) checkKeyOrder(v *verdict) int {
	l.mu.Lock()
	byConsumer := make(map[int][]event)
	for _, e := range l.events {
		byConsumer[e.consumer] = append(byConsumer[e.consumer], e)
	}
	l.mu.Unlock()
	type lane struct {
		p      int32
		assign uint64
		key    string
	}
	checked := 0
	for id, evs := range byConsumer {
		slices.SortFunc(evs, func(a, b event) int { return cmp.Compare(a.seq, b.seq) })
		running := make(map[string]po) // key -> the record of it running now
		last := make(map[lane]int64)
		for _, e := range evs {
			key, name := e.key, fmt.Sprintf("key %q", e.key)
			if key == "" {
				key, name = fmt.Sprintf("\x00%d", e.p), "no key"
			}
			k := po{e.p, e.o}
			switch e.kind {
			case 'S':
				checked++
				if r, busy := running[key]; busy {
					v.add("consumer %d: record %v with %s started while %v with the same key was still running", id, k, name, r)
				}
				running[key] = k
				ln := lane{e.p, e.assign, key}
				if prev, ok := last[ln]; ok && e.o < prev {
					v.add("consumer %d, assignment %d of partition %d: %s started %v after offset %d", id, e.assign, e.p, name, k, prev)
				}
				last[ln] = e.o
			case 'A', 'N':
				if running[key] == k {
					delete(running, key)
				}
			}
		}
	}
	return checked
}

// ackedBefore returns how many records were first acked before t.
func (l *ledger) ackedBefore(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, at := range l.firstAck {
		if at.Before(t) {
			n++
		}
	}
	return n
}

// duplicates returns how many records were acked more than once, and the
// acks beyond the first.
func (l *ledger) duplicates() (twice, extra int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.acks {
		if n > 1 {
			twice++
			extra += n - 1
		}
	}
	return twice, extra
}

// dupSamples describes a few records acked more than once: by whom, when,
// and in which assignment their handlers started.
func (l *ledger) dupSamples(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var keys []po
	for k, c := range l.acks {
		if c > 1 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b po) int { return cmp.Or(cmp.Compare(a.p, b.p), cmp.Compare(a.o, b.o)) })
	keys = keys[:min(n, len(keys))]
	want := make(map[po]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	var base time.Time
	for _, e := range l.events {
		if e.kind == 'A' && (base.IsZero() || e.at.Before(base)) {
			base = e.at
		}
	}
	desc := make(map[po][]string)
	for _, e := range l.events {
		k := po{e.p, e.o}
		if !want[k] {
			continue
		}
		switch e.kind {
		case 'S':
			desc[k] = append(desc[k], fmt.Sprintf("started by %d (assignment %d)", e.consumer, e.assign))
		case 'A':
			desc[k] = append(desc[k], fmt.Sprintf("acked by %d at +%v", e.consumer, e.at.Sub(base).Round(time.Millisecond)))
		case 'N':
			desc[k] = append(desc[k], fmt.Sprintf("nacked by %d", e.consumer))
		}
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%v: %s", k, strings.Join(desc[k], "; ")))
	}
	return out
}
