package consume

import (
	"sync"
	"time"

	"github.com/safeack/safeack/internal/partition"
)

// WorkerSet is a set of running partition workers, safe for concurrent
// use. One type serves every place that needs to know which workers run:
// a group handler's (its session's claims), a subscription's without a
// group (noGroupConsumer), and the Subscriber's registry (every
// subscription's, for Stats, Totals and Windows). The methods that act on
// the workers take a snapshot and act outside the set's lock, so a worker
// that answers slowly never holds up adding or removing another.
type WorkerSet struct {
	mu      sync.Mutex
	workers map[*partition.Worker]time.Time // each worker, and when it was added
}

// Add puts w in the set.
func (s *WorkerSet) Add(w *partition.Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers == nil {
		s.workers = make(map[*partition.Worker]time.Time)
	}
	s.workers[w] = time.Now()
}

// Remove takes w out of the set and reports whether it was there.
func (s *WorkerSet) Remove(w *partition.Worker) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.workers[w]
	delete(s.workers, w)
	return ok
}

// list returns the workers in the set now, in no order.
func (s *WorkerSet) list() []*partition.Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*partition.Worker, 0, len(s.workers))
	for w := range s.workers {
		out = append(out, w)
	}
	return out
}

// Each calls f with every worker and when it was added, under the set's
// lock: f must be quick and must not use the set.
func (s *WorkerSet) Each(f func(w *partition.Worker, added time.Time)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w, at := range s.workers {
		f(w, at)
	}
}

// setHighWaterMarks lists the high-water marks of the workers' partitions
// and gives each worker its own, for Stats: Sarama refreshes a
// partition's only with the fetches of an unpaused partition, and a
// partition whose fetching is paused behind a slow record would otherwise
// show a lag frozen at the pause while records keep arriving. The set
// holds the workers of one subscription: one per partition. It returns
// the workers listed, and the partitions whose leader did not answer,
// with why.
func (s *WorkerSet) setHighWaterMarks(reads clusterReads) (listed []*partition.Worker, failed map[int32]error) {
	workers := s.list()
	if len(workers) == 0 {
		return nil, nil
	}
	byPartition := make(map[int32]*partition.Worker, len(workers))
	parts := make([]int32, 0, len(workers))
	for _, w := range workers {
		byPartition[w.Partition()] = w
		parts = append(parts, w.Partition())
	}
	// One request per leader and no retry: the next interval tries again,
	// and the caller is not held up by a leader that is away.
	hwms, failed := reads.HighWaterMarks(parts)
	for p, off := range hwms {
		byPartition[p].SetHighWaterMark(off)
	}
	return workers, failed
}

// marked returns the offset each worker last handed to its Marker, by
// partition: the set holds one subscription's workers.
func (s *WorkerSet) marked() map[int32]int64 {
	workers := s.list()
	out := make(map[int32]int64, len(workers))
	for _, w := range workers {
		out[w.Partition()] = w.Marked()
	}
	return out
}

// markTails marks every worker's completed prefix with its tail.
func (s *WorkerSet) markTails() {
	for _, w := range s.list() {
		w.MarkTail()
	}
}

// endAll ends every worker's assignment.
func (s *WorkerSet) endAll() {
	for _, w := range s.list() {
		w.End()
	}
}
