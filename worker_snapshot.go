package safeack

import (
	"time"

	"github.com/safeack/safeack/frontier"
)

func (w *partitionWorker) highWaterMark() int64 {
	if w.hwm == nil {
		return -1
	}
	return w.hwm()
}

// oldestAge returns how long the oldest unfinished record has been held.
// Callers hold mu.
func (w *partitionWorker) oldestAge(ts frontier.Stats) time.Duration {
	if !ts.HasUnfinished {
		w.accepted.dropBelow(ts.Delivered)
		return 0
	}
	at, ok := w.accepted.dropBelow(ts.OldestUnfinished)
	if !ok {
		return 0
	}
	return time.Since(at)
}

// acceptLog remembers when records were taken from Kafka, in offset order,
// so the age of the oldest unfinished one can be told without a map.
type acceptLog struct {
	offsets []int64
	times   []time.Time
	head    int
}

func (l *acceptLog) push(offset int64, at time.Time) {
	if l.head > 0 && l.head >= len(l.offsets)/2 {
		n := copy(l.offsets, l.offsets[l.head:])
		copy(l.times, l.times[l.head:])
		l.offsets, l.times, l.head = l.offsets[:n], l.times[:n], 0
	}
	l.offsets = append(l.offsets, offset)
	l.times = append(l.times, at)
}

// dropBelow forgets records below offset and returns the time of the first
// one left, if any.
func (l *acceptLog) dropBelow(offset int64) (time.Time, bool) {
	for l.head < len(l.offsets) && l.offsets[l.head] < offset {
		l.head++
	}
	if l.head == len(l.offsets) {
		return time.Time{}, false
	}
	return l.times[l.head], true
}
