package safeack

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/safeack/safeack/internal/partition"
)

// TopicPartition names one Kafka partition.
type TopicPartition struct {
	Topic     string
	Partition int32
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
	// IgnoredMetadata counts commit metadata found and not trusted
	// (another client's, corrupt, or relative to another offset).
	IgnoredMetadata uint64
	// LogTruncations counts starts at which the partition's log was found
	// truncated under the group's commit (an unclean leader election: the
	// committed leader epoch ends below the committed offset). The start
	// moved back to where the log diverged and the completed tail was
	// dropped: those records are handled again.
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
	workers workerSet
	// mu orders attach and detach with Totals, which reads ended and
	// workers together: an ending assignment's counters are in one of
	// them, never both or neither.
	mu    sync.Mutex
	ended map[TopicPartition]*PartitionTotals // for Totals: see totals.go
}

func (r *registry) attach(w *partition.Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.workers.add(w)
	r.assigned(w)
}

func (r *registry) detach(w *partition.Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.workers.remove(w) {
		r.retire(w)
	}
}

func (r *registry) snapshot() []PartitionStats {
	out := []PartitionStats{}
	r.workers.each(func(w *partition.Worker, at time.Time) {
		ps := partitionStats(w)
		ps.AssignedAt = at
		out = append(out, ps)
	})
	slices.SortFunc(out, func(a, b PartitionStats) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
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
