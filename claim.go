package safeack

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/keygate"
)

// offsetMarker is the part of a Sarama consumer-group session a partition
// needs. Without a consumer group it is nil and nothing is marked.
type offsetMarker interface {
	MarkOffset(topic string, partition int32, offset int64, metadata string)
	ResetOffset(topic string, partition int32, offset int64, metadata string)
	Commit()
}

// fetchPauser pauses and resumes fetching of partitions: a Sarama consumer
// or consumer group.
type fetchPauser interface {
	Pause(map[string][]int32)
	Resume(map[string][]int32)
}

// record is one delivered Kafka record on its way through a handler.
type record struct {
	msg    *sarama.ConsumerMessage
	ticket frontier.Ticket
	owner  *partitionWorker

	key   uint64
	gated bool // holds its key in the ordering gate until completed

	wm           *message.Message // the current delivery
	cancel       context.CancelFunc
	deliveredAt  time.Time // of the current delivery; written before it is handed out
	unmarshalErr error

	// deferred is set by Defer before the handler returns: when it holds
	// the Completion of the delivery being acked, the router's Ack leaves
	// the ticket open until that Completion is resolved. It is compared
	// per delivery, never reset: a Completion of an earlier, nacked
	// delivery must not hold back (or complete) a later one.
	deferred atomic.Pointer[Completion]
	// skipped is set when the record's handler was not run because its
	// assignment had ended; its Nack must not redeliver.
	skipped atomic.Bool
}

// partitionWorker owns one assigned partition: it takes records from the
// claim, registers them with the frontier tracker, passes them through the
// ordering gate, hands them to the subscription's output, and marks the
// completed prefix as acks arrive. Its run loop is the only goroutine that
// reads the claim, sends on the output and marks offsets; acks reach it
// through the state under mu and a wake-up signal.
type partitionWorker struct {
	sub       *subscription
	topic     string
	partition int32
	marker    offsetMarker // nil without a consumer group
	logFields watermill.LogFields

	// ctx is the assignment's context: it ends with the assignment, and
	// with it the contexts of the messages handed out (see parentCtx).
	ctx    context.Context
	cancel context.CancelFunc
	// parentCtx carries ctx's values without its cancellation, so that a
	// message context does not register in ctx's children (a map insert and
	// delete per message); await cancels message contexts when ctx ends.
	parentCtx context.Context
	// abandoned closes when the assignment is over: waiters for acks of
	// messages that outlived the drain stop waiting.
	abandoned chan struct{}

	wake chan struct{} // capacity 1: "state under mu changed"

	mu       sync.Mutex
	tracker  *frontier.Tracker
	gate     *keygate.Gate[*record]
	released []*record // records the gate let through on an ack, for run to emit
	resend   []*record // nacked records due for redelivery
	// Owned by run: the previous released and resend slices, for reuse.
	spareReleased, spareResend []*record
	inFlight                   int         // handed out, not yet acked or nacked
	dirty                      atomic.Bool // a completion may have moved the prefix
	counters                   partitionCounters
	marked                     int64 // last offset marked; written by run
	confirmed                  int64 // last offset the coordinator reported committed; -1 unknown
	stuckFlag                  bool  // mirrors stuck != nil for Stats
	paused                     bool  // the tail nears its budget; mirrors for Stats
	pausedFor                  time.Duration
	tailBytes                  int  // size of the last encoded tail
	tailCut                    bool // the last encoded tail did not fit whole
	accepted                   acceptLog
	hwm                        func() int64 // the claim's high-water mark; nil when unknown

	// Owned by run.
	pauser      fetchPauser // nil: fetching is never paused
	fetchPaused bool
	fetched     fifo[*sarama.ConsumerMessage] // taken from the claim, not yet accepted
	ready       fifo[*record]
	hasToken    bool
	stuck       *record // a record the unmarshaler rejected; the partition waits on it
	seed        maphash.Seed
	skip        frontier.Tail // completed tail read back from the last commit
	tailBuf     []byte
	rangeBuf    []frontier.Range
	lastMeta    string
	nextMarkAt  time.Time // the tail is encoded at most once per commit interval
	pausedAt    time.Time
}

type partitionCounters struct {
	redeliveries      uint64
	unmarshalFailures uint64
	skippedRevoked    uint64
	skippedTail       uint64
	ignoredMetadata   uint64
	deferred          uint64
	tailEncodes       uint64
}

func newPartitionWorker(sub *subscription, parent context.Context, marker offsetMarker, topic string, partition int32, start int64) (*partitionWorker, error) {
	tracker, err := frontier.New(start, sub.cfg.MaxPendingPerPartition)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(parent)
	w := &partitionWorker{
		sub:       sub,
		topic:     topic,
		partition: partition,
		marker:    marker,
		logFields: sub.logFields.Add(watermill.LogFields{"kafka_partition": partition, "kafka_initial_offset": start}),
		ctx:       ctx,
		cancel:    cancel,
		parentCtx: context.WithoutCancel(ctx),
		abandoned: make(chan struct{}),
		wake:      make(chan struct{}, 1),
		tracker:   tracker,
		gate:      keygate.New[*record](),
		seed:      sub.seed,
		marked:    start,
		confirmed: -1,
	}
	return w, nil
}

// skipCompleted makes the worker complete, without delivering, the records
// that the committed metadata says a previous owner already completed. The
// metadata is trusted only when it decodes as our tail relative to the
// offset this assignment starts at.
func (w *partitionWorker) skipCompleted(c committedOffset, start int64) {
	if w.sub.cfg.DisableCompletedTail || c.offset < 0 || c.metadata == "" {
		return
	}
	tail, err := frontier.DecodeTail(c.metadata, start)
	if err != nil || c.offset != start {
		w.mu.Lock()
		w.counters.ignoredMetadata++
		w.mu.Unlock()
		w.sub.logger.Info("Ignoring commit metadata; records after the committed offset are redelivered",
			w.logFields.Add(watermill.LogFields{"err": fmt.Sprint(err), "committed": c.offset}))
		return
	}
	w.skip = tail
	w.sub.logger.Info("Completed tail found in commit metadata; these records will not be handled again",
		w.logFields.Add(watermill.LogFields{"completed_offsets": tail.Len(), "ranges": len(tail.Ranges)}))
}

func (w *partitionWorker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run consumes the claim until it is revoked or the subscription stops,
// then drains. It returns after the final mark.
func (w *partitionWorker) run(messages <-chan *sarama.ConsumerMessage, stop <-chan struct{}) {
	var retry, markLater *time.Timer
	var retryC, markC <-chan time.Time
	defer func() {
		if retry != nil {
			retry.Stop()
		}
		if markLater != nil {
			markLater.Stop()
		}
	}()
	for {
		room := w.collect()
		if due := w.markIfAdvanced(false); !due.IsZero() && markC == nil {
			markLater = time.NewTimer(time.Until(due))
			markC = markLater.C
		}

		// Take a record only when nothing is ready to hand out (so the
		// in-flight bound also bounds fetching), the tracker has room, and
		// the tail is not near its budget. Otherwise records wait in the
		// fetched queue, and fetching pauses once it holds a few.
		accepting := room && w.ready.len() == 0 && w.stuck == nil && !w.tailPaused()
		for accepting && w.fetched.len() > 0 {
			w.accept(w.fetched.pop())
			accepting = w.ready.len() == 0 && w.stuck == nil && w.hasRoom()
		}
		w.fetchControl(accepting)

		// Fast paths without the full select, the common case under load:
		// hand out the next ready record if a token and a receiver are
		// there, or take the next fetched record if one is waiting.
		if w.tryHandOut() {
			continue
		}
		if accepting && w.ready.len() == 0 {
			select {
			case m, ok := <-messages:
				if !ok {
					w.drain("claim closed")
					return
				}
				w.accept(m)
				continue
			default:
			}
		}

		var out chan<- *message.Message
		var acquire chan<- struct{}
		var next *message.Message
		if r := w.ready.peek(); r != nil {
			if w.hasToken {
				out, next = w.sub.output, r.wm
				stampDelivery(r)
			} else {
				acquire = w.sub.tokens
			}
		}
		if w.stuck != nil && retryC == nil {
			retry = time.NewTimer(w.sub.retrySleep())
			retryC = retry.C
		}

		// The claim is always read, even when nothing can be accepted: a
		// cooperative rebalance revokes a claim only by closing its
		// channel, and that must be seen at once.
		select {
		case m, ok := <-messages:
			if !ok {
				w.drain("claim closed")
				return
			}
			if accepting && w.fetched.len() == 0 {
				w.accept(m)
			} else {
				w.fetched.push(m)
			}
		case acquire <- struct{}{}:
			w.hasToken = true
		case out <- next:
			w.hasToken = false
			w.emitted(w.ready.pop())
		case <-w.wake:
		case <-retryC:
			retry, retryC = nil, nil
			w.retryStuck()
		case <-markC:
			markLater, markC = nil, nil
			w.markIfAdvanced(true)
		case <-stop:
			w.drain("stopped")
			return
		case <-w.ctx.Done():
			w.drain("context done")
			return
		}
	}
}

// tryHandOut hands out the next ready record when a token is free and a
// receiver waits, without blocking. It reports whether it did.
func (w *partitionWorker) tryHandOut() bool {
	r := w.ready.peek()
	if r == nil {
		return false
	}
	if !w.hasToken {
		select {
		case w.sub.tokens <- struct{}{}:
			w.hasToken = true
		default:
			return false
		}
	}
	stampDelivery(r)
	select {
	case w.sub.output <- r.wm:
		w.hasToken = false
		w.emitted(w.ready.pop())
		return true
	default:
		return false
	}
}

// stampDelivery records when the record's current delivery is handed out;
// it is written before the send, so the handler reads it safely.
func stampDelivery(r *record) {
	if r.deliveredAt.IsZero() {
		r.deliveredAt = time.Now()
	}
}

// pauseAfter is how many fetched records may wait unaccepted before the
// partition's fetching is paused. Pausing at once would toggle the
// partition on every record while MaxInFlight is saturated.
const pauseAfter = 64

// fetchControl pauses fetching while records wait unaccepted, and resumes
// it once they have all been taken. The fetched queue is bounded by what
// the client had fetched before the pause took effect.
func (w *partitionWorker) fetchControl(accepting bool) {
	switch {
	case w.pauser == nil:
	case !w.fetchPaused && w.fetched.len() >= pauseAfter:
		w.pauser.Pause(map[string][]int32{w.topic: {w.partition}})
		w.fetchPaused = true
	case w.fetchPaused && accepting && w.fetched.len() == 0:
		w.pauser.Resume(map[string][]int32{w.topic: {w.partition}})
		w.fetchPaused = false
	}
}

func (w *partitionWorker) hasRoom() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.roomLocked()
}

// roomLocked reports whether another record may be taken: the tracker has
// room and the ordering mode's read-ahead is not used up. Callers hold mu.
func (w *partitionWorker) roomLocked() bool {
	return w.tracker.Retained() < w.tracker.Capacity() && w.readAheadLeft()
}

// partitionReadAhead bounds the records taken ahead in OrderByPartition
// mode. There, every record waits for the one before it, so reading further
// ahead adds no concurrency, only memory; in key mode a deep read-ahead is
// what lets other keys pass a busy one.
const partitionReadAhead = 16

// readAheadLeft reports whether the ordering mode lets another record be
// taken. Callers hold mu.
func (w *partitionWorker) readAheadLeft() bool {
	return w.sub.cfg.Ordering != OrderByPartition || w.gate.Waiting() < partitionReadAhead
}

// collect moves records that acks and nacks made ready into the run
// loop's own queue, redeliveries first: they hold their keys. It reports
// whether the tracker has room for another record.
func (w *partitionWorker) collect() (room bool) {
	w.mu.Lock()
	resend, released := w.resend, w.released
	// Swap in the slices emptied last time, so that steady state does not
	// allocate.
	w.resend, w.released = w.spareResend[:0], w.spareReleased[:0]
	room = w.roomLocked()
	w.mu.Unlock()
	for i := len(resend) - 1; i >= 0; i-- {
		w.redeliver(resend[i])
	}
	for _, r := range released {
		w.makeReady(r)
	}
	clear(resend)
	clear(released)
	w.spareResend, w.spareReleased = resend, released
	return room
}

// accept registers a record with the tracker before anything else sees it,
// so no completion can move the prefix past it.
func (w *partitionWorker) accept(m *sarama.ConsumerMessage) {
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
		w.sub.logger.Error("Record refused by the frontier tracker; partition stops", err, w.logFields.Add(watermill.LogFields{"kafka_partition_offset": m.Offset}))
		w.setStuck(&record{msg: m, owner: w})
		return
	}
	r := &record{msg: m, ticket: tk, owner: w}
	if len(w.skip.Ranges) > 0 {
		if w.skip.Contains(m.Offset) {
			w.mu.Lock()
			w.counters.skippedTail++
			w.mu.Unlock()
			w.complete(r, false)
			return
		}
		if m.Offset >= w.skip.Ranges[len(w.skip.Ranges)-1].To || m.Offset >= w.skip.Bound {
			w.skip = frontier.Tail{} // past the tail: nothing more to skip
		}
	}
	if !w.prepare(r) {
		w.setStuck(r)
		return
	}
	w.admit(r)
}

// prepare unmarshals the record into its first delivery. It reports false
// when the unmarshaler rejects it.
func (w *partitionWorker) prepare(r *record) bool {
	wm, err := w.sub.cfg.Unmarshaler.Unmarshal(r.msg)
	if err != nil {
		r.unmarshalErr = err
		w.mu.Lock()
		w.counters.unmarshalFailures++
		w.mu.Unlock()
		w.sub.logger.Error("Cannot unmarshal record; the partition waits on it", err,
			w.logFields.Add(watermill.LogFields{"kafka_partition_offset": r.msg.Offset}))
		return false
	}
	r.wm = wm
	return true
}

// makeReady gives the record's delivery its context and queues it to be
// handed out. Contexts are made only here, once a record may start, so
// records waiting for their key cost none.
func (w *partitionWorker) makeReady(r *record) {
	ctx, cancel := context.WithCancel(context.WithValue(w.parentCtx, recordCtxKey{}, r))
	r.wm.SetContext(ctx)
	r.cancel = cancel
	r.deliveredAt = time.Time{}
	w.ready.push(r)
}

// admit passes a prepared record through the ordering gate.
func (w *partitionWorker) admit(r *record) {
	key, ordered := w.orderingKey(r.msg)
	if !ordered {
		w.makeReady(r)
		return
	}
	r.key, r.gated = key, true
	w.mu.Lock()
	start := w.gate.Admit(key, r)
	w.mu.Unlock()
	if start {
		w.makeReady(r)
	}
}

func (w *partitionWorker) orderingKey(m *sarama.ConsumerMessage) (uint64, bool) {
	switch w.sub.cfg.Ordering {
	case OrderByPartition:
		return 0, true
	case Unordered:
		return 0, false
	}
	k := m.Key
	if f := w.sub.cfg.OrderingKey; f != nil {
		k = f(m)
	}
	if len(k) == 0 {
		return 0, false
	}
	return maphash.Bytes(w.seed, k), true
}

// retryStuck retries a record the unmarshaler rejected, or hands it to
// OnUnmarshalError. Only success lets the partition go on.
func (w *partitionWorker) retryStuck() {
	r := w.stuck
	if !r.ticket.Valid() {
		return // refused by the tracker: nothing can fix it in this assignment
	}
	if h := w.sub.cfg.OnUnmarshalError; h != nil {
		if err := h(w.ctx, r.msg, r.unmarshalErr); err != nil {
			w.sub.logger.Error("OnUnmarshalError failed; will retry", err,
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

func (w *partitionWorker) setStuck(r *record) {
	w.stuck = r
	w.mu.Lock()
	w.stuckFlag = r != nil
	w.mu.Unlock()
}

// emitted is called once a record's message was taken by the consumer.
func (w *partitionWorker) emitted(r *record) {
	w.mu.Lock()
	w.inFlight++
	w.mu.Unlock()
	go w.await(r, r.wm, r.cancel)
}

// await turns the message's Ack or Nack into a completion or redelivery.
func (w *partitionWorker) await(r *record, wm *message.Message, cancel context.CancelFunc) {
	select {
	case <-w.ctx.Done():
		// The assignment ended: cancel the message's context (it does not
		// derive from the assignment's) and keep waiting for its answer.
		cancel()
	case <-wm.Acked():
		w.answered(r, wm, cancel, true)
		return
	case <-wm.Nacked():
		w.answered(r, wm, cancel, false)
		return
	}
	select {
	case <-wm.Acked():
		w.answered(r, wm, cancel, true)
	case <-wm.Nacked():
		w.answered(r, wm, cancel, false)
	case <-w.abandoned:
		cancel()
		w.sub.releaseToken()
	}
}

func isDeferredDelivery(r *record, wm *message.Message) bool {
	c := r.deferred.Load()
	return c != nil && c.msg == wm
}

// answered handles the Ack or Nack of one delivery.
func (w *partitionWorker) answered(r *record, wm *message.Message, cancel context.CancelFunc, acked bool) {
	cancel()
	w.sub.releaseToken()
	switch {
	case !acked:
		w.nacked(r)
	case isDeferredDelivery(r, wm):
		// The handler handed the record to something asynchronous: the
		// ticket completes when its Completion is resolved. It stays
		// counted in flight so that a drain waits for it.
	default:
		w.complete(r, true)
	}
}

// complete finishes a record's ticket; handedOut says whether it was
// counted in flight.
func (w *partitionWorker) complete(r *record, handedOut bool) {
	w.mu.Lock()
	if handedOut {
		w.inFlight--
	}
	if w.tracker.Complete(r.ticket) {
		w.dirty.Store(true)
		if r.gated {
			if next, ok := w.gate.Release(r.key); ok {
				w.released = append(w.released, next)
			}
		}
	}
	w.mu.Unlock()
	w.poke()
}

func (w *partitionWorker) nacked(r *record) {
	w.mu.Lock()
	w.inFlight--
	if !r.skipped.Load() {
		w.counters.redeliveries++
	}
	w.mu.Unlock()
	w.poke()
	if r.skipped.Load() {
		return // left unfinished for the partition's next owner
	}
	if d := w.sub.cfg.NackResendSleep; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-w.ctx.Done():
			t.Stop()
			return
		}
	}
	if w.ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	w.resend = append(w.resend, r)
	w.mu.Unlock()
	w.poke()
}

// redeliver queues a nacked record first in line, with a fresh delivery: a
// copy of its message (Copy drops the ack state) with a new context.
func (w *partitionWorker) redeliver(r *record) {
	r.wm = r.wm.Copy()
	w.makeReady(r)
	w.ready.pushFront(w.ready.popBack())
}

// markIfAdvanced hands the completed prefix to Sarama when it changed,
// with the completed tail in the metadata. With the tail on, encoding
// happens at most once per commit interval, since Sarama commits no more
// often: when a mark is waiting for that, markIfAdvanced returns when it is
// due. force marks now (the wait is over, or the partition is draining).
func (w *partitionWorker) markIfAdvanced(force bool) (due time.Time) {
	tailOn := w.marker != nil && !w.sub.cfg.DisableCompletedTail
	if !w.dirty.Load() {
		return time.Time{}
	}
	w.mu.Lock()
	if tailOn && !force && time.Now().Before(w.nextMarkAt) {
		w.mu.Unlock()
		return w.nextMarkAt
	}
	w.dirty.Store(false)
	safe, err := w.tracker.SafeOffset()
	if err != nil {
		w.mu.Unlock()
		return time.Time{}
	}
	w.accepted.dropBelow(safe) // keeps the log as short as the retained window
	if tailOn {
		w.rangeBuf = w.tracker.AppendCompleted(w.rangeBuf[:0])
	}
	prev := w.marked
	w.marked = max(prev, safe)
	w.mu.Unlock()

	var meta string
	if tailOn {
		meta = w.encodeTail(safe)
	}
	switch {
	case w.marker == nil:
	case safe > prev:
		w.marker.MarkOffset(w.topic, w.partition, safe, meta)
	case safe == prev && meta != w.lastMeta:
		// MarkOffset ignores a mark at or below Sarama's current offset, so
		// a tail that grew behind an unchanged head is written with
		// ResetOffset, which applies at or below it. The MarkOffset first
		// covers a group without any commit yet (Sarama's offset is then
		// -1). Neither can move the offset back: Sarama's offset is the
		// committed start or an earlier mark, both at most safe.
		w.marker.MarkOffset(w.topic, w.partition, safe, meta)
		w.marker.ResetOffset(w.topic, w.partition, safe, meta)
	}
	w.lastMeta = meta
	return time.Time{}
}

// encodeTail encodes the completed ranges in rangeBuf relative to safe,
// within the metadata budget, and updates the pause state.
func (w *partitionWorker) encodeTail(safe int64) string {
	budget := w.sub.cfg.TailMetadataBudget
	w.nextMarkAt = time.Now().Add(w.sub.cfg.commitInterval())
	buf, bound, err := frontier.AppendTail(w.tailBuf[:0], safe, w.rangeBuf, budget)
	if err != nil {
		// The tracker's ranges are valid by construction; if not, commit
		// plain offsets rather than anything doubtful.
		w.sub.logger.Error("Cannot encode the completed tail; committing the offset alone", err, w.logFields)
		buf = buf[:0]
	}
	w.tailBuf = buf
	cut := err == nil && bound != math.MaxInt64
	pause := false
	if f := w.sub.cfg.PauseAtTailUsage; f > 0 && len(w.rangeBuf) > 0 {
		pause = cut || float64(len(buf)) >= f*float64(budget)
	}
	now := time.Now()
	w.mu.Lock()
	w.counters.tailEncodes++
	w.tailBytes, w.tailCut = len(buf), cut
	if pause != w.paused {
		if pause {
			w.pausedAt = now
		} else {
			w.pausedFor += now.Sub(w.pausedAt)
		}
		w.paused = pause
	}
	w.mu.Unlock()
	return string(buf)
}

// tailPaused reports whether taking records waits for the tail to shrink.
// Only run writes paused, so run reads it without the lock.
func (w *partitionWorker) tailPaused() bool { return w.paused }

// drain ends the assignment: nothing more is handed out, contexts of
// unacked messages are cancelled, acks are awaited up to DrainTimeout, the
// final completed prefix is marked (and committed when commits are manual),
// and the tracker is revoked so that later acks change nothing.
func (w *partitionWorker) drain(reason string) {
	w.cancel()
	if w.hasToken {
		w.hasToken = false
		w.sub.releaseToken()
	}
	w.ready.clear()
	w.fetched.clear()
	if w.fetchPaused {
		// Sarama keeps a partition paused across reassignment: a later
		// owner of this partition in this member must find it fetching.
		w.pauser.Resume(map[string][]int32{w.topic: {w.partition}})
		w.fetchPaused = false
	}

	// Waiting for acks serves the final commit. Without a consumer group
	// nothing is committed, so there is nothing to wait for.
	wait := w.sub.cfg.DrainTimeout
	if w.marker == nil {
		wait = 0
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	timedOut := false
	for !timedOut {
		w.mu.Lock()
		n := w.inFlight
		w.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-w.wake:
		case <-deadline.C:
			timedOut = true
		}
	}
	w.markIfAdvanced(true)

	w.mu.Lock()
	left := w.inFlight
	stats := w.tracker.Stats()
	w.tracker.Revoke()
	w.gate.Drain(nil)
	w.resend, w.released = nil, nil
	w.mu.Unlock()
	close(w.abandoned)

	if w.marker != nil && !w.sub.autoCommit() {
		w.marker.Commit()
	}
	fields := w.logFields.Add(watermill.LogFields{
		"reason":      reason,
		"safe_offset": stats.SafeOffset,
		"retained":    stats.Retained,
		"abandoned":   left,
	})
	if timedOut {
		w.sub.logger.Info("Partition drain timed out; unacked records are left to the next owner", fields)
	} else {
		w.sub.logger.Debug("Partition drained", fields)
	}
}

func (w *partitionWorker) setConfirmed(offset int64) {
	w.mu.Lock()
	w.confirmed = offset
	w.mu.Unlock()
}

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

// fifo is a queue that reuses its storage and has a cheap push to the
// front, for redeliveries.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

// peek returns the first item, or the zero T when the queue is empty.
func (q *fifo[T]) peek() (first T) {
	if q.head < len(q.items) {
		first = q.items[q.head]
	}
	return first
}

func (q *fifo[T]) push(v T) { q.items = append(q.items, v) }

func (q *fifo[T]) pushFront(v T) {
	if q.head > 0 {
		q.head--
		q.items[q.head] = v
		return
	}
	var zero T
	q.items = append(q.items, zero)
	copy(q.items[1:], q.items)
	q.items[0] = v
}

func (q *fifo[T]) pop() T {
	var zero T
	v := q.items[q.head]
	q.items[q.head] = zero
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return v
}

func (q *fifo[T]) popBack() T {
	var zero T
	v := q.items[len(q.items)-1]
	q.items[len(q.items)-1] = zero
	q.items = q.items[:len(q.items)-1]
	return v
}

func (q *fifo[T]) clear() {
	clear(q.items)
	q.items, q.head = q.items[:0], 0
}
