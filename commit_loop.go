package safeack

import (
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
)

// commitSoon asks the commit loop to commit without waiting for the next
// interval. It never blocks.
func (h *groupHandler) commitSoon() {
	select {
	case h.soon <- struct{}{}:
	default:
	}
}

// earlyCommitGap is the least time between a commit and an early one: a
// tenth of the commit interval, at most maxEarlyCommitGap. A partition that
// keeps catching up (every record complete, none waiting) then costs at most
// ten commits per interval, and at most one per maxEarlyCommitGap.
func earlyCommitGap(interval time.Duration) time.Duration {
	return min(interval/10, maxEarlyCommitGap)
}

const maxEarlyCommitGap = 100 * time.Millisecond

// commitLoop commits the session's marks once per commit interval: it first
// marks every partition's completed tail, so that a completed record waits
// at most one interval (plus the commit's round trip) to be covered, then
// commits, then reads back what the coordinator holds (Stats'
// ConfirmedOffset). A partition with every received record complete asks
// for a commit at once (commitSoon), within earlyCommitGap. It ends when
// the subscription stops.
func (h *groupHandler) commitLoop(sess sarama.ConsumerGroupSession, stop, done, soon chan struct{}) {
	defer close(done)
	interval := h.sub.subscriber.commitEvery
	t := time.NewTicker(interval)
	defer t.Stop()
	var early *time.Timer
	var earlyC <-chan time.Time
	defer func() {
		if early != nil {
			early.Stop()
		}
	}()
	gap := earlyCommitGap(interval)
	last := time.Now()
	retries := 0
	later := func(wait time.Duration) {
		if earlyC == nil {
			early = time.NewTimer(wait)
			earlyC = early.C
		}
	}
	// commitEarly commits, then reads back what the broker holds: Sarama
	// reports no failed commit to its caller, and a failed early commit
	// would otherwise wait a whole interval for the next one.
	commitEarly := func() {
		sent := h.markedOffsets()
		ob := h.observeCommit()
		sess.Commit()
		ob.sentNow()
		last = time.Now()
		behind := h.confirm(sent)
		ob.confirmed()
		if behind && retries < maxEarlyCommitRetries {
			retries++
			later(gap)
			return
		}
		retries = 0
	}
	for {
		select {
		case <-t.C:
			h.markTails()
			ob := h.observeCommit()
			sess.Commit()
			ob.sentNow()
			last = time.Now()
			h.confirm(nil)
			ob.confirmed()
			h.listHighWaterMarks()
		case <-soon:
			if wait := gap - time.Since(last); wait <= 0 {
				commitEarly()
			} else {
				later(wait)
			}
		case <-earlyC:
			early, earlyC = nil, nil
			commitEarly()
		case <-stop:
			return
		case <-h.sub.halt.stopped:
			// The subscription stops: Cleanup commits once, for every
			// claim, after the drains. Commits of the loop meanwhile
			// would queue at a slow coordinator ahead of that one.
			return
		}
	}
}

// maxEarlyCommitRetries bounds the early commits repeated because the
// broker did not take the previous one; after that the next interval's
// commit tries again.
const maxEarlyCommitRetries = 3

// markedOffsets returns the offset each of the session's partitions last
// handed to Sarama.
func (h *groupHandler) markedOffsets() map[int32]int64 {
	workers := h.workers.list()
	out := make(map[int32]int64, len(workers))
	for _, w := range workers {
		out[w.Partition()] = w.Marked()
	}
	return out
}

// markTails marks every partition's completed prefix with its tail.
func (h *groupHandler) markTails() {
	for _, w := range h.workers.list() {
		w.MarkTail()
	}
}

// confirm reads the committed offsets of this session's partitions.
// It reports whether any partition of sent (offsets handed to Sarama
// before a commit) is still committed below it: that commit failed.
func (h *groupHandler) confirm(sent map[int32]int64) (behind bool) {
	workers := h.workers.list()
	parts := make([]int32, 0, len(workers))
	for _, w := range workers {
		parts = append(parts, w.Partition())
	}
	committed, err := fetchCommitted(h.client, h.sub.cfg.ConsumerGroup, h.sub.topic, parts)
	if err != nil {
		h.sub.logger.Debug("Cannot read back committed offsets", h.sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		return len(sent) > 0
	}
	for _, w := range workers {
		if c, ok := committed[w.Partition()]; ok {
			w.SetConfirmed(c.offset)
		}
	}
	for p, c := range committed {
		if off, ok := sent[p]; ok && c.offset < off {
			behind = true
		}
	}
	return behind
}

// hwmListEvery is the least time between two listings of a session's
// high-water marks: the transactional commit loop ticks every 100 ms.
const hwmListEvery = time.Second

// listHighWaterMarks lists the high-water marks of the session's
// partitions, for Stats (see workerSet.setHighWaterMarks), on a goroutine of its own
// so that a broker slow to answer never holds a commit up, at most one
// listing at a time and one per hwmListEvery.
func (h *groupHandler) listHighWaterMarks() {
	now := time.Now().UnixNano()
	if now-h.hwmListedAt.Load() < int64(hwmListEvery) || !h.hwmListing.CompareAndSwap(false, true) {
		return
	}
	h.hwmListedAt.Store(now)
	go func() {
		defer h.hwmListing.Store(false)
		h.workers.setHighWaterMarks(h.client, h.sub.topic)
	}()
}
