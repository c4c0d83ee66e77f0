package partition

import (
	"time"

	"github.com/safeack/safeack/frontier"
)

// Counters count what happened to a partition over an assignment. Their
// fields are those of the root package's PartitionCounters, which converts
// from them.
type Counters struct {
	Offered, Completed          uint64
	Redeliveries                uint64
	UnmarshalFailures           uint64
	SkippedTail, SkippedRevoked uint64
	DeadLettered                uint64
	IgnoredMetadata             uint64
	LogTruncations              uint64
	Deferred                    uint64
	PausedFor                   time.Duration
}

// Stats is a snapshot of a worker; the root package's PartitionStats
// documents the fields.
type Stats struct {
	SafeOffset, MarkedOffset, ConfirmedOffset  int64
	HighWaterMark, Lag                         int64
	Delivered                                  int64
	Retained, Blocked, InFlight, WaitingForKey int
	OldestUnfinished                           int64
	HasUnfinished                              bool
	OldestUnfinishedAge                        time.Duration
	Stuck, Paused                              bool
	TailBytes                                  int
	TailTruncated                              bool
	TailEncodes                                uint64
	Counters                                   Counters
}

// Stats returns a snapshot of the worker, read under its lock.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	ts := w.tracker.Stats()
	pausedFor := w.pausedFor
	if w.paused {
		pausedFor += time.Since(w.pausedAt)
	}
	hwm := w.highWaterMark()
	return Stats{
		SafeOffset:          ts.SafeOffset,
		MarkedOffset:        w.marked,
		ConfirmedOffset:     w.confirmed,
		HighWaterMark:       hwm,
		Lag:                 max(hwm-ts.SafeOffset, 0),
		Delivered:           ts.Delivered,
		Retained:            ts.Retained,
		Blocked:             ts.Blocked,
		InFlight:            w.inFlight,
		WaitingForKey:       w.gate.Waiting(),
		OldestUnfinished:    ts.OldestUnfinished,
		HasUnfinished:       ts.HasUnfinished,
		OldestUnfinishedAge: w.oldestAge(ts),
		Stuck:               w.stuckShown,
		Paused:              w.paused,
		TailBytes:           w.tailBytes,
		TailTruncated:       w.tailCut,
		TailEncodes:         w.counters.tailEncodes,
		Counters: Counters{
			Offered:           ts.Offered,
			Completed:         ts.Completed,
			Redeliveries:      w.counters.redeliveries,
			UnmarshalFailures: w.counters.unmarshalFailures,
			SkippedTail:       w.counters.skippedTail,
			SkippedRevoked:    w.counters.skippedRevoked,
			DeadLettered:      w.counters.deadLettered,
			IgnoredMetadata:   w.counters.ignoredMetadata,
			LogTruncations:    w.counters.logTruncations,
			Deferred:          w.counters.deferred,
			PausedFor:         pausedFor,
		},
	}
}

// Window returns the tracker's statistics and the retained records as runs
// (see frontier.Tracker.AppendWindow), looking at no more than maxEntries
// records (all when maxEntries <= 0), read in one instant under the lock.
// truncated reports that more are retained.
func (w *Worker) Window(maxEntries int) (ts frontier.Stats, runs []frontier.WindowRun, truncated bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ts = w.tracker.Stats()
	runs, truncated = w.tracker.AppendWindow(nil, maxEntries)
	return ts, runs, truncated
}

// highWaterMark is the newer of the claim's and the listed one: the
// claim's is not refreshed while fetching is paused, so a partition held
// by a slow record would show a lag that stopped growing. Callers hold mu.
func (w *Worker) highWaterMark() int64 {
	if w.hwm == nil {
		return w.listedHWM
	}
	return max(w.hwm(), w.listedHWM)
}

// SetHighWaterMark records the partition's high-water mark as listed by
// the caller, for Stats. The last listing replaces the previous one: a log
// truncated below it (an unclean leader election) shows at the next.
func (w *Worker) SetHighWaterMark(offset int64) {
	w.mu.Lock()
	w.listedHWM = offset
	w.mu.Unlock()
}

// oldestAge returns how long the oldest unfinished record has been held.
// Callers hold mu.
func (w *Worker) oldestAge(ts frontier.Stats) time.Duration {
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
