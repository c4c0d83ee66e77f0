package safeack

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/consume"
	"github.com/safeack/safeack/internal/partition"
)

// TopicPartition names one Kafka partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

func (tp TopicPartition) topicPartition() TopicPartition { return tp }

// sortByTopicPartition orders the snapshots Stats, Totals and Windows
// return by topic, then partition.
func sortByTopicPartition[T interface{ topicPartition() TopicPartition }](s []T) {
	slices.SortFunc(s, func(a, b T) int {
		x, y := a.topicPartition(), b.topicPartition()
		return cmp.Or(cmp.Compare(x.Topic, y.Topic), cmp.Compare(x.Partition, y.Partition))
	})
}

// PartitionStats is a snapshot of one partition owned by a Subscriber.
type PartitionStats struct {
	TopicPartition

	// SafeOffset is the completed prefix: the offset a consumer may resume
	// from without losing an unfinished record. It is what gets marked.
	// When Sarama started the partition at Consumer.Offsets.Initial (no
	// commit, or one out of range), it is the broker's answer for that
	// setting until the first record arrives, and from then on counts
	// from that record.
	SafeOffset int64
	// MarkedOffset is the last offset handed to Sarama to commit: the
	// committed offset the assignment started from, or -1 until the first
	// record fixes a start that Sarama resolved from Offsets.Initial.
	MarkedOffset int64
	// ConfirmedOffset is what the group coordinator holds as committed,
	// read back after each commit interval; -1 when unknown or none. It
	// lags MarkedOffset by up to two commit intervals.
	ConfirmedOffset int64
	// HighWaterMark is the partition's high-water mark as last fetched or
	// listed (once per commit interval: fetching pauses behind a slow
	// record), and Lag the records between it and SafeOffset.
	HighWaterMark, Lag int64
	// Delivered is the position after the last record taken from Kafka.
	Delivered int64
	// Retained counts records held: running, waiting for their key, and
	// completed but blocked behind an unfinished one.
	Retained int
	// Blocked counts completed records held behind an unfinished one.
	Blocked int
	// InFlight counts messages handed out and not yet acked or nacked.
	InFlight int
	// WaitingForKey counts records waiting for a busy ordering key (in
	// partition mode, and for key-less records in key mode, for the
	// record before them).
	WaitingForKey int
	// OldestUnfinished is the offset of the oldest unfinished record, valid
	// when HasUnfinished.
	OldestUnfinished int64
	HasUnfinished    bool
	// OldestUnfinishedAge is how long the oldest unfinished record has
	// been held, measured from when it was taken from Kafka.
	OldestUnfinishedAge time.Duration
	// Stuck reports that the partition waits on a record the unmarshaler
	// rejected.
	Stuck bool
	// Paused reports that taking records waits for the completed tail to
	// shrink (PauseAtTailUsage).
	Paused bool
	// TailBytes is the size of the last completed tail written to the
	// commit metadata, and TailTruncated whether it did not fit whole.
	TailBytes     int
	TailTruncated bool
	// TailEncodes counts completed tails encoded for this assignment: at
	// most one per commit interval, plus, with PauseAtTailUsage, those that
	// measure a growing tail between commits (a number logarithmic in its
	// growth).
	TailEncodes uint64
	// PartitionCounters count over this assignment: they start again from
	// zero when the partition is reassigned (see Totals).
	PartitionCounters
	// AssignedAt is when this member got the partition.
	AssignedAt time.Time
}

// PartitionCounters count what happened to a partition: PartitionStats
// over one assignment, PartitionTotals over all of them.
type PartitionCounters struct {
	// Offered and Completed count records.
	Offered, Completed uint64
	// Redeliveries counts nacks. UnmarshalFailures counts rejected
	// unmarshal attempts.
	Redeliveries      uint64
	UnmarshalFailures uint64
	// SkippedTail counts records not delivered because the commit metadata
	// said a previous owner completed them. SkippedRevoked counts messages
	// whose handler was not run because their assignment had ended.
	SkippedTail, SkippedRevoked uint64
	// DeadLettered counts records PoisonQueue published to a dead-letter
	// topic (they are also counted in Completed).
	DeadLettered uint64
	// IgnoredMetadata counts commit metadata found and not trusted
	// (another client's, corrupt, or relative to another offset).
	IgnoredMetadata uint64
	// LogTruncations counts the truncations of the partition's log found
	// under the group's commit or its completed tail at a start, or while
	// the partition was consumed (an unclean leader election: the leader
	// epoch the group or this member last validated ends below what it
	// committed or took from the log). The position moved back to where
	// the log diverged (a start there, or a commit there that ended the
	// session), with the completed tail cut there: the records the log now
	// holds from there on are handled.
	LogTruncations uint64
	// Deferred counts completions deferred with Defer.
	Deferred uint64
	// PausedFor sums the time spent paused (PauseAtTailUsage).
	PausedFor time.Duration
}

func (c *PartitionCounters) add(o PartitionCounters) {
	c.Offered += o.Offered
	c.Completed += o.Completed
	c.Redeliveries += o.Redeliveries
	c.UnmarshalFailures += o.UnmarshalFailures
	c.SkippedTail += o.SkippedTail
	c.SkippedRevoked += o.SkippedRevoked
	c.DeadLettered += o.DeadLettered
	c.IgnoredMetadata += o.IgnoredMetadata
	c.LogTruncations += o.LogTruncations
	c.Deferred += o.Deferred
	c.PausedFor += o.PausedFor
}

// Stats returns a snapshot of every partition the Subscriber currently
// owns, ordered by topic and partition.
func (s *Subscriber) Stats() []PartitionStats {
	return s.registry.snapshot()
}

// registry tracks the partitions a Subscriber owns, for Stats, Totals and
// Windows: the workers of all its subscriptions.
type registry struct {
	workers consume.WorkerSet
	// mu orders attach and detach with Totals, which reads ended and
	// workers together: an ending assignment's counters are in one of
	// them, never both or neither.
	mu    sync.Mutex
	ended map[TopicPartition]*PartitionTotals // for Totals
}

func (r *registry) attach(w *partition.Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.workers.Add(w)
	r.assigned(w)
}

func (r *registry) detach(w *partition.Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.workers.Remove(w) {
		r.retire(w)
	}
}

func (r *registry) snapshot() []PartitionStats {
	out := []PartitionStats{}
	r.workers.Each(func(w *partition.Worker, at time.Time) {
		ps := partitionStats(w)
		ps.AssignedAt = at
		out = append(out, ps)
	})
	sortByTopicPartition(out)
	return out
}

// partitionStats converts a worker's snapshot.
func partitionStats(w *partition.Worker) PartitionStats {
	s := w.Stats()
	return PartitionStats{
		TopicPartition:      TopicPartition{Topic: w.Topic(), Partition: w.Partition()},
		SafeOffset:          s.SafeOffset,
		MarkedOffset:        s.MarkedOffset,
		ConfirmedOffset:     s.ConfirmedOffset,
		HighWaterMark:       s.HighWaterMark,
		Lag:                 s.Lag,
		Delivered:           s.Delivered,
		Retained:            s.Retained,
		Blocked:             s.Blocked,
		InFlight:            s.InFlight,
		WaitingForKey:       s.WaitingForKey,
		OldestUnfinished:    s.OldestUnfinished,
		HasUnfinished:       s.HasUnfinished,
		OldestUnfinishedAge: s.OldestUnfinishedAge,
		Stuck:               s.Stuck,
		Paused:              s.Paused,
		TailBytes:           s.TailBytes,
		TailTruncated:       s.TailTruncated,
		TailEncodes:         s.TailEncodes,
		PartitionCounters:   PartitionCounters(s.Counters),
	}
}

// PartitionTotals are the counters of one topic-partition summed over every
// assignment of it this Subscriber has had. PartitionStats counts over one
// assignment and starts again from zero when the partition is reassigned (a
// rebalance, a reconnect); PartitionTotals never go down, so they suit
// monitoring counters. An ended assignment's counters are added when it
// ends; anything it counts after that (a late nack of an abandoned message)
// is not.
type PartitionTotals struct {
	TopicPartition
	// Assignments counts the assignments of the partition to this
	// Subscriber, the current one included.
	Assignments uint64
	// Owned reports whether the Subscriber owns the partition now.
	Owned bool
	// PartitionCounters sum the counters of every assignment.
	PartitionCounters
}

// Totals returns the cumulative counters of every topic-partition the
// Subscriber has owned since it was created, ordered by topic and
// partition. Partitions it no longer owns stay in the list with Owned
// false.
func (s *Subscriber) Totals() []PartitionTotals {
	r := &s.registry
	r.mu.Lock()
	sums := make(map[TopicPartition]PartitionTotals, len(r.ended))
	for tp, t := range r.ended {
		sums[tp] = *t
	}
	r.workers.Each(func(w *partition.Worker, _ time.Time) {
		tp := TopicPartition{Topic: w.Topic(), Partition: w.Partition()}
		t := sums[tp]
		t.add(partitionStats(w).PartitionCounters)
		t.Owned = true
		sums[tp] = t
	})
	r.mu.Unlock()
	out := make([]PartitionTotals, 0, len(sums))
	for tp, t := range sums {
		t.TopicPartition = tp
		out = append(out, t)
	}
	sortByTopicPartition(out)
	return out
}

// assigned counts a new assignment. The caller holds r.mu.
func (r *registry) assigned(w *partition.Worker) {
	r.totalsOf(w).Assignments++
}

// retire adds the counters of an ending assignment to its partition's
// totals. The caller holds r.mu, and took w out of r.workers under it.
func (r *registry) retire(w *partition.Worker) {
	r.totalsOf(w).add(partitionStats(w).PartitionCounters)
}

func (r *registry) totalsOf(w *partition.Worker) *PartitionTotals {
	if r.ended == nil {
		r.ended = make(map[TopicPartition]*PartitionTotals)
	}
	tp := TopicPartition{Topic: w.Topic(), Partition: w.Partition()}
	t := r.ended[tp]
	if t == nil {
		t = &PartitionTotals{TopicPartition: tp}
		r.ended[tp] = t
	}
	return t
}

// PartitionWindow is a snapshot of the records one owned partition retains:
// those between its completed prefix and the position after the last record
// taken from Kafka, as runs of unfinished and completed-but-blocked records.
// It is what a live display draws to show a slow record holding a
// partition back.
type PartitionWindow struct {
	TopicPartition
	// SafeOffset, Delivered, Retained and Blocked are PartitionStats'
	// fields of the same names, read in the same instant as Runs.
	SafeOffset, Delivered int64
	Retained, Blocked     int
	// Runs are the retained records, oldest first: the first run is
	// unfinished and starts at the oldest unfinished record; unfinished and
	// completed runs alternate after it.
	Runs []WindowRun
	// Truncated reports that the partition retains more records than the
	// maxEntries given to Windows; Runs then stop after that many.
	Truncated bool
}

// WindowRun is a maximal run of consecutive retained records of a
// partition that are all unfinished or all completed: From and To bound
// the offsets [From, To) (the holes after the run's records included),
// Records counts its delivered records, and Done tells completed runs from
// unfinished ones. It is the frontier package's type, which documents the
// fields.
type WindowRun = frontier.WindowRun

// Windows returns the retained window of every partition the Subscriber
// owns, ordered by topic and partition, looking at no more than maxEntries
// records per partition (all of them when maxEntries <= 0). Each partition
// is read under its lock in O(min(retained, maxEntries)), so a display
// polling a few times a second should pass a bound of a few thousand.
func (s *Subscriber) Windows(maxEntries int) []PartitionWindow {
	out := []PartitionWindow{}
	s.registry.workers.Each(func(w *partition.Worker, _ time.Time) {
		out = append(out, partitionWindow(w, maxEntries))
	})
	sortByTopicPartition(out)
	return out
}

// partitionWindow converts a worker's window.
func partitionWindow(w *partition.Worker, maxEntries int) PartitionWindow {
	ts, runs, truncated := w.Window(maxEntries)
	return PartitionWindow{
		TopicPartition: TopicPartition{Topic: w.Topic(), Partition: w.Partition()},
		SafeOffset:     ts.SafeOffset,
		Delivered:      ts.Delivered,
		Retained:       ts.Retained,
		Blocked:        ts.Blocked,
		Runs:           runs,
		Truncated:      truncated,
	}
}
