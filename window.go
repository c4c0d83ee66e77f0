package safeack

import (
	"cmp"
	"slices"
	"time"

	"github.com/safeack/safeack/internal/partition"
)

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
// partition that are all unfinished or all completed.
type WindowRun struct {
	// From is the offset of the run's first record. To is where the next
	// run starts or, for the last run, the position after its last record:
	// the offsets [From, To) include the holes (offsets never delivered,
	// such as compacted ones) after the run's records.
	From, To int64
	// Records counts the delivered records in the run.
	Records int
	// Done reports whether the run's records completed (and are blocked
	// behind an unfinished one) rather than unfinished.
	Done bool
}

// Windows returns the retained window of every partition the Subscriber
// owns, ordered by topic and partition, looking at no more than maxEntries
// records per partition (all of them when maxEntries <= 0). Each partition
// is read under its lock in O(min(retained, maxEntries)), so a display
// polling a few times a second should pass a bound of a few thousand.
func (s *Subscriber) Windows(maxEntries int) []PartitionWindow {
	out := []PartitionWindow{}
	s.registry.workers.each(func(w *partition.Worker, _ time.Time) {
		out = append(out, partitionWindow(w, maxEntries))
	})
	slices.SortFunc(out, func(a, b PartitionWindow) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// partitionWindow converts a worker's window.
func partitionWindow(w *partition.Worker, maxEntries int) PartitionWindow {
	ts, runs, truncated := w.Window(maxEntries)
	out := PartitionWindow{
		TopicPartition: TopicPartition{Topic: w.Topic(), Partition: w.Partition()},
		SafeOffset:     ts.SafeOffset,
		Delivered:      ts.Delivered,
		Retained:       ts.Retained,
		Blocked:        ts.Blocked,
		Truncated:      truncated,
	}
	for _, r := range runs {
		out.Runs = append(out.Runs, WindowRun(r))
	}
	return out
}
