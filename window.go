package safeack

import (
	"cmp"
	"slices"

	"github.com/safeack/safeack/frontier"
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
	// Runs are the retained records, oldest first (see
	// frontier.Tracker.AppendWindow): the first run is unfinished and
	// starts at the oldest unfinished record.
	Runs []frontier.WindowRun
	// Truncated reports that the partition retains more records than the
	// maxEntries given to Windows; Runs then stop after that many.
	Truncated bool
}

// Windows returns the retained window of every partition the Subscriber
// owns, ordered by topic and partition, looking at no more than maxEntries
// records per partition (all of them when maxEntries <= 0). Each partition
// is read under its lock in O(min(retained, maxEntries)), so a display
// polling a few times a second should pass a bound of a few thousand.
func (s *Subscriber) Windows(maxEntries int) []PartitionWindow {
	r := &s.registry
	r.mu.Lock()
	out := make([]PartitionWindow, 0, len(r.workers))
	for w := range r.workers {
		out = append(out, w.window(maxEntries))
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b PartitionWindow) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

func (w *partitionWorker) window(maxEntries int) PartitionWindow {
	w.mu.Lock()
	defer w.mu.Unlock()
	ts := w.tracker.Stats()
	runs, more := w.tracker.AppendWindow(nil, maxEntries)
	return PartitionWindow{
		TopicPartition: TopicPartition{Topic: w.topic, Partition: w.partition},
		SafeOffset:     ts.SafeOffset,
		Delivered:      ts.Delivered,
		Retained:       ts.Retained,
		Blocked:        ts.Blocked,
		Runs:           runs,
		Truncated:      more,
	}
}
