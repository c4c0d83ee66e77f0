package safeack

import (
	"cmp"
	"slices"
	"time"

	"github.com/safeack/safeack/internal/partition"
)

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
	r.workers.each(func(w *partition.Worker, _ time.Time) {
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
	slices.SortFunc(out, func(a, b PartitionTotals) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
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
