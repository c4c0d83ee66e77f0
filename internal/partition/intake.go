package partition

import (
	"hash/maphash"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/backoff"
)

// accept registers a record with the tracker before anything else sees it,
// so no completion can move the prefix past it.
func (w *Worker) accept(m *sarama.ConsumerMessage) {
	w.rateCount++
	if w.startPending {
		w.fixStart(m.Offset)
	}
	w.mu.Lock()
	tk, err := w.tracker.OfferOne(m.Offset, m.Offset+1)
	if err == nil {
		w.accepted.push(m.Offset, time.Now())
	}
	w.mu.Unlock()
	if err != nil {
		// The claim's offsets are increasing and capacity was checked
		// before reading, so this is a broken invariant: refuse the record
		// loudly rather than deliver something the commit cannot cover.
		w.cfg.Logger.Error("Record refused by the frontier tracker; partition stops", err, w.logFields.Add(watermill.LogFields{"kafka_partition_offset": m.Offset}))
		w.setStuck(&Record{msg: m, owner: w})
		return
	}
	r := &Record{msg: m, ticket: tk, owner: w}
	if len(w.inheritedTail.Ranges) > 0 {
		if w.inheritedTail.Contains(m.Offset) {
			w.mu.Lock()
			w.counters.skippedTail++
			w.mu.Unlock()
			w.complete(r, false)
			return
		}
		if m.Offset >= w.inheritedTail.Ranges[len(w.inheritedTail.Ranges)-1].To || m.Offset >= w.inheritedTail.Bound {
			w.inheritedTail = frontier.Tail{} // past the tail: nothing more to skip
		}
	}
	if !w.prepare(r) {
		w.setStuck(r)
		return
	}
	w.admit(r)
}

// fixStart starts the bookkeeping at the first record delivered, when
// Sarama resolved the start itself (Consumer.Offsets.Initial: a commit out
// of range, or no commit on a partition whose start Setup could not pin,
// see internal/consume's sessionOffsets.pinStarts). That record is where fetching
// really started, or the first one that exists after it (compaction,
// transaction markers). The position is committed before the record is
// handed out, so a group that delivered anything has an in-range commit at
// or before its oldest unfinished record: the next owner resumes there and
// does not fall back to Offsets.Initial, which at OffsetNewest would skip
// the record, and at OffsetOldest re-handle history.
//
// A commit below the log start (retention, DeleteRecords) may carry a
// completed tail that reaches above it: those records are skipped here as
// after any commit, and the start is committed with them as its tail
// (when tails are written), so that the next owner skips them too.
//
// Marking and resetting both is what lands Sarama's offset exactly on the
// start: MarkOffset only moves forward (from no commit, or from a commit
// below the log start), ResetOffset only back (from a commit above the
// high-water mark, which Sarama keeps as its current offset).
func (w *Worker) fixStart(first int64) {
	tracker, err := frontier.New(first, w.cfg.MaxPending)
	if err != nil {
		// The claim delivered a negative offset: accept refuses it below.
		return
	}
	w.mu.Lock()
	w.tracker = tracker // the estimate's tracker was never offered a record
	w.startPending = false
	if w.marker != nil {
		w.marked = first
	}
	w.mu.Unlock()
	w.logFields = w.logFields.Add(watermill.LogFields{"kafka_initial_offset": first})
	tail := w.tailAbove(first)
	w.inheritedTail = tail
	if w.marker == nil {
		return
	}
	var meta string
	if w.cfg.CompletedTail && len(tail.Ranges) > 0 {
		// A tail cut by the budget lists fewer records: the next owner
		// handles the rest again, nothing is lost.
		meta, _, _ = frontier.EncodeTail(first, tail.Ranges, w.cfg.TailBudget)
	}
	if r, ok := w.marker.(Restarter); ok {
		r.Restart(w.partition, first, tail)
	}
	w.markMu.Lock()
	w.marker.MarkOffset(w.topic, w.partition, first, meta)
	w.marker.ResetOffset(w.topic, w.partition, first, meta)
	w.lastMeta = meta
	w.markMu.Unlock()
	w.marker.Commit()
	if w.startHeld != nil && !w.confirmStart(first) {
		// The assignment ended before the coordinator took the start:
		// hand nothing out, the drain follows.
		w.mu.Lock()
		w.handOutStopped = true
		w.mu.Unlock()
		return
	}
	w.cfg.Logger.Debug("Partition starts at its first record; committed that position", w.logFields)
}

// staleCommit is a group commit Sarama did not fetch from: out of range.
type staleCommit struct {
	offset   int64
	metadata string
}

// tailAbove returns what the completed tail of the stale commit (see
// StartFromCommit) lists at or above first, the partition's real start,
// relative to first. A commit at or below first was below the log start:
// the records its tail lists above first were completed by a previous
// owner. A commit above first was above the high-water mark (the log was
// truncated, or the topic recreated): the offsets its tail lists are not
// those records, and it is ignored.
func (w *Worker) tailAbove(first int64) frontier.Tail {
	sc := w.staleCommit
	w.staleCommit = staleCommit{offset: -1}
	none := frontier.Tail{Base: first, Bound: first}
	if sc.offset < 0 {
		return none
	}
	if sc.offset > first {
		w.ignoreMetadata(sc.offset, "the committed offset is above where fetching starts: its tail does not list these records")
		return none
	}
	tail, err := frontier.DecodeTail(sc.metadata, sc.offset)
	if err != nil {
		w.ignoreMetadata(sc.offset, err.Error())
		return none
	}
	above := frontier.Tail{Base: first, Bound: max(tail.Bound, first)}
	for _, r := range tail.Ranges {
		if r.To > first {
			above.Ranges = append(above.Ranges, frontier.Range{From: max(r.From, first), To: r.To})
		}
	}
	if len(above.Ranges) > 0 {
		w.cfg.Logger.Info("Completed tail found in a commit below the partition's start; the records it lists above the start will not be handled again",
			w.logFields.Add(watermill.LogFields{"committed": sc.offset, "completed_offsets": above.Len(), "ranges": len(above.Ranges)}))
	}
	return above
}

// confirmStart commits the start again until the coordinator holds it (a
// coordinator loading or moving the group refuses commits, and Sarama does
// not say so). It reports false if the assignment ended first, or its claim
// was closed (a cooperative revocation) or stop closed meanwhile. A record
// handed out before would be skipped by the next owner, should this member
// die: the group's commit is still out of range, or missing, and Sarama
// resolves Offsets.Initial afresh.
func (w *Worker) confirmStart(first int64) bool {
	var pace backoff.Doubling
	for !w.startHeld(first) {
		wait := pace.Next()
		w.cfg.Logger.Info("The partition's start is not committed yet; nothing is handed out until it is",
			w.logFields.Add(watermill.LogFields{"start": first, "retry_in": wait.String()}))
		if !w.waitReadingClaim(wait) {
			return false
		}
		w.marker.Commit()
	}
	return true
}

// waitReadingClaim waits d for run, which cannot select meanwhile, and
// reads the claim as run would: a cooperative revocation only closes it,
// and Sarama waits for the claim to end, up to Rebalance.Timeout, before
// it ends the whole session. Records read go to the fetched queue, under
// its flow control. It reports false when the claim closed, stop closed or
// the assignment ended: run drains next (a closed claim reads as closed
// again).
func (w *Worker) waitReadingClaim(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case m, ok := <-w.claim:
			if !ok {
				return false
			}
			if w.fromClaim(m) {
				w.fetched.push(m)
				w.fetchControl()
			}
		case <-w.stop:
			return false
		case <-w.ctx.Done():
			return false
		}
	}
}

// StartFromCommit takes what the group's commit says of the partition, as
// the session read it. Its offset is what the coordinator holds (Stats'
// ConfirmedOffset). Its metadata, when it decodes as a completed tail
// relative to the offset this assignment starts at, lists records a
// previous owner completed: they are completed here without being
// delivered, whether or not this worker writes tails itself. When Sarama
// did not fetch from the commit (out of range), the first record decides
// what of the tail still holds (see fixStart). Metadata that does not
// decode is counted, logged and otherwise ignored. Call it before Run.
func (w *Worker) StartFromCommit(offset int64, metadata string) {
	w.SetConfirmed(offset)
	if metadata == "" || offset < 0 {
		return
	}
	if _, epochOnly := frontier.LeaderEpochOf(metadata); epochOnly {
		if t, err := frontier.DecodeTail(metadata, max(offset, 0)); err == nil && len(t.Ranges) == 0 {
			return // the leader epoch alone (checked by the subscriber): no tail
		}
	}
	if !w.start.Resolved {
		w.staleCommit = staleCommit{offset: offset, metadata: metadata}
		return
	}
	if offset != w.start.Offset {
		w.ignoreMetadata(offset, "the committed offset is not where fetching starts")
		return
	}
	tail, err := frontier.DecodeTail(metadata, offset)
	if err != nil {
		w.ignoreMetadata(offset, err.Error())
		return
	}
	w.inheritedTail = tail
	w.cfg.Logger.Info("Completed tail found in commit metadata; these records will not be handled again",
		w.logFields.Add(watermill.LogFields{"completed_offsets": tail.Len(), "ranges": len(tail.Ranges)}))
}

// CountLogTruncation counts a start the subscriber moved back because the
// partition's log was truncated under the group's commit. Call it before
// Run.
func (w *Worker) CountLogTruncation() {
	w.mu.Lock()
	w.counters.logTruncations++
	w.mu.Unlock()
}

// ignoreMetadata counts and logs commit metadata that is not trusted.
func (w *Worker) ignoreMetadata(committed int64, why string) {
	w.mu.Lock()
	w.counters.ignoredMetadata++
	w.mu.Unlock()
	w.cfg.Logger.Info("Ignoring commit metadata; records after the committed offset are redelivered",
		w.logFields.Add(watermill.LogFields{"reason": why, "committed": committed}))
}

// prepare unmarshals the record into its first delivery. It reports false
// when the unmarshaler rejects it.
func (w *Worker) prepare(r *Record) bool {
	wm, err := w.cfg.Unmarshaler.Unmarshal(r.msg)
	if err != nil {
		r.unmarshalErr = err
		w.mu.Lock()
		w.counters.unmarshalFailures++
		w.mu.Unlock()
		w.cfg.Logger.Error("Cannot unmarshal record; the partition waits on it", err,
			w.logFields.Add(watermill.LogFields{"kafka_partition_offset": r.msg.Offset}))
		return false
	}
	r.wm = wm
	return true
}

// admit passes a prepared record through the ordering gate into the ready
// queue.
func (w *Worker) admit(r *Record) {
	key, ordered := w.orderingKey(r.msg)
	r.key, r.gated = key, ordered
	w.mu.Lock()
	if !ordered || w.gate.Admit(key, r) {
		w.ready.push(r)
	}
	w.mu.Unlock()
}

// noKeyLane is the gate key of records that must run one at a time in
// their partition: every record under ByPartition, and key-less ones
// under ByKey, which keep watermill-kafka's one-at-a-time order (its
// DefaultMarshaler sets no key). No real key hashes to it (see
// orderingKey), so a keyed record never waits for key-less ones or the
// reverse.
const noKeyLane uint64 = 0

// orderingKey returns the gate key of m, and false when m may run beside
// any other record.
func (w *Worker) orderingKey(m *sarama.ConsumerMessage) (uint64, bool) {
	switch w.cfg.Ordering {
	case ByPartition:
		return noKeyLane, true
	case Unordered:
		return 0, false
	}
	k := m.Key
	if f := w.cfg.OrderingKey; f != nil {
		k = f(m)
	}
	if len(k) == 0 {
		return noKeyLane, true
	}
	h := maphash.Bytes(w.cfg.Seed, k)
	if h == noKeyLane {
		// Share a lane with another key instead (a collision the gate
		// already allows: it only serializes more).
		h++
	}
	return h, true
}

// retryStuck retries a record the unmarshaler rejected, or hands it to
// OnUnmarshalError. Only success lets the partition go on.
func (w *Worker) retryStuck() {
	r := w.stuck
	if !r.ticket.Valid() {
		return // refused by the tracker: nothing can fix it in this assignment
	}
	if h := w.cfg.OnUnmarshalError; h != nil {
		if err := h(w.ctx, r.msg, r.unmarshalErr); err != nil {
			w.cfg.Logger.Error("OnUnmarshalError failed; will retry", err,
				w.logFields.Add(watermill.LogFields{"kafka_partition_offset": r.msg.Offset}))
			return
		}
		w.setStuck(nil)
		w.complete(r, false)
		return
	}
	if w.prepare(r) {
		w.setStuck(nil)
		w.admit(r)
	}
}

func (w *Worker) setStuck(r *Record) {
	w.stuck = r
	w.mu.Lock()
	w.stuckShown = r != nil
	w.mu.Unlock()
}

// takeFirstRecords queues records the subscriber fetched before the
// claim's first fetch (Assignment.FirstRecords). The claim fetches them
// again; fromClaim drops those.
func (w *Worker) takeFirstRecords(recs []*sarama.ConsumerMessage) {
	w.firstRecords = nil
	if len(recs) == 0 {
		return
	}
	for _, m := range recs {
		w.fetched.push(m)
	}
	w.claimFrom = recs[len(recs)-1].Offset + 1
	w.received.Store(max(w.received.Load(), w.claimFrom))
	w.cfg.Logger.Trace("Took the partition's first records from a fetch of its own", w.logFields.Add(watermill.LogFields{
		"records": len(recs), "first_offset": recs[0].Offset, "next_offset": w.claimFrom,
	}))
}

// fromClaim reports whether m, read from the claim, is new: not one of the
// first records taken before it. The claim's first record also closes the
// door on first records that have not arrived yet.
func (w *Worker) fromClaim(m *sarama.ConsumerMessage) bool {
	w.firstRecords = nil
	if m.Offset < w.claimFrom {
		return false
	}
	w.received.Store(max(w.received.Load(), m.Offset+1))
	return true
}

// Received returns the offset after the last record taken from the claim
// (or from the first records fetched beside it), -1 before the first: what
// the partition's fetching has passed, as far as this worker knows. Safe
// to call from any goroutine.
func (w *Worker) Received() int64 { return w.received.Load() }
