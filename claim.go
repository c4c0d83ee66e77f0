package safeack

import (
	"context"
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
// ordering gate into the ready queue, and marks the completed prefix as acks
// arrive. Its run loop is the only goroutine that reads the claim and marks
// offsets; acks reach it through the state under mu and a wake-up signal.
//
// Ready records are handed out by the run loop and, to keep the handlers fed
// without a round trip through it, by the goroutine that saw the previous
// ack: it passes its in-flight token on to the next ready record (see
// completeAndContinue). The run loop refills the ready queue a batch at a
// time.
type partitionWorker struct {
	sub       *subscription
	topic     string
	partition int32
	marker    offsetMarker // nil without a consumer group
	txn       *txnMarker   // transactional mode: outputs of acked deliveries go with marker
	logFields watermill.LogFields

	// ctx is the assignment's context: it ends when the assignment starts
	// ending (the drain begins). From then on nothing new is handed out,
	// SkipRevoked skips handlers not yet started and AssignmentEnded
	// reports true; running handlers keep their message contexts.
	ctx    context.Context
	cancel context.CancelFunc
	// parentCtx carries ctx's values without its cancellation: a message
	// context must outlive ctx through the drain, and not registering in
	// ctx's children saves a map insert and delete per message.
	parentCtx context.Context
	// abandoned closes when the drain gives up (DrainTimeout passed, or
	// nothing is left to wait for): the waiters of messages still
	// unanswered cancel their contexts and stop waiting. awaiting counts
	// those waiters, so that the drain returns only once every message
	// context is cancelled.
	abandoned chan struct{}
	awaiting  sync.WaitGroup

	wake chan struct{} // capacity 1: "state under mu changed"

	// handout is held shared by every goroutine sending on the output
	// outside the run loop; drain takes it exclusively to stop them before
	// the assignment ends (the output is closed after that).
	handout sync.RWMutex

	mu      sync.Mutex
	tracker *frontier.Tracker
	gate    *keygate.Gate[*record]
	// ready holds records that may start now, in hand-out order:
	// redeliveries first, then records the gate let through, then new
	// ones. Their message contexts are made when they are handed out.
	ready      fifo[*record]
	handedDone bool         // the assignment is ending: nothing more is handed out
	inFlight   int          // handed out, not yet acked or nacked
	holding    atomic.Int32 // tokens held by this partition's unanswered messages
	dirty      atomic.Bool  // a completion may have moved the prefix
	counters   partitionCounters
	marked     int64 // last offset marked; written by run
	confirmed  int64 // last offset the coordinator reported committed; -1 unknown
	stuckFlag  bool  // mirrors stuck != nil for Stats
	paused     bool  // the tail nears its budget: run takes no records (see tailCheckDueLocked)
	pausedFor  time.Duration
	tailBytes  int  // size of the last encoded tail
	tailCut    bool // the last encoded tail did not fit whole
	accepted   acceptLog
	hwm        func() int64 // the claim's high-water mark; nil when unknown
	// startPending: Sarama resolved Consumer.Offsets.Initial itself, so
	// the tracker's start is an estimate until the first record (see
	// fixStart). Written by run under mu.
	startPending bool

	// Owned by run.
	pauser      fetchPauser // nil: fetching is never paused
	fetchPaused bool
	takeRate    float64                       // records/s taken from the fetched queue lately
	rateFrom    time.Time                     // start of the current rate window
	rateCount   int                           // records taken since rateFrom
	fetched     fifo[*sarama.ConsumerMessage] // taken from the claim, not yet accepted
	next        *record                       // popped from ready with a token, being sent
	stuck       *record                       // a record the unmarshaler rejected; the partition waits on it
	seed        maphash.Seed
	skip        frontier.Tail // completed tail read back from the last commit

	// markMu serializes marking: run marks plain advances at once, the
	// session's commit loop marks completed tails once per commit interval.
	// It guards the fields below.
	markMu   sync.Mutex
	tailBuf  []byte
	rangeBuf []frontier.Range
	lastMeta string
	// requestCommit asks the session to commit soon; nil without a group.
	requestCommit func()
	pausedAt      time.Time
	// tailRecheckAt: with PauseAtTailUsage, the tail is encoded between
	// commits once its TailLenBound reaches this (an eighth above the
	// bound at the last encoding).
	tailRecheckAt int
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

// startPosition is where a partition's bookkeeping begins.
type startPosition struct {
	// offset is where fetching starts when resolved; otherwise the
	// broker's answer for Consumer.Offsets.Initial, an estimate that only
	// Stats shows until the first record arrives.
	offset int64
	// resolved says that offset is where Sarama fetches from: a committed,
	// in-range offset, or one resolved before ConsumePartition. When Sarama
	// resolved Consumer.Offsets.Initial itself (no commit, or a committed
	// offset out of range), the first record delivered fixes the start.
	resolved bool
}

func newPartitionWorker(sub *subscription, parent context.Context, marker offsetMarker, topic string, partition int32, start startPosition) (*partitionWorker, error) {
	tracker, err := frontier.New(max(start.offset, 0), sub.cfg.MaxPendingPerPartition)
	if err != nil {
		return nil, err
	}
	marked := start.offset
	if !start.resolved {
		marked = -1 // nothing is marked until the first record fixes the start
	}
	ctx, cancel := context.WithCancel(parent)
	w := &partitionWorker{
		sub:          sub,
		topic:        topic,
		partition:    partition,
		marker:       marker,
		logFields:    sub.logFields.Add(watermill.LogFields{"kafka_partition": partition, "kafka_initial_offset": start.offset}),
		ctx:          ctx,
		cancel:       cancel,
		parentCtx:    context.WithoutCancel(ctx),
		abandoned:    make(chan struct{}),
		wake:         make(chan struct{}, 1),
		tracker:      tracker,
		gate:         keygate.New[*record](),
		seed:         sub.seed,
		marked:       marked,
		confirmed:    -1,
		startPending: !start.resolved,
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
	if c.offset != start {
		w.ignoreMetadata(c, "the committed offset is not where fetching starts")
		return
	}
	tail, err := frontier.DecodeTail(c.metadata, start)
	if err != nil {
		w.ignoreMetadata(c, err.Error())
		return
	}
	w.skip = tail
	w.sub.logger.Info("Completed tail found in commit metadata; these records will not be handled again",
		w.logFields.Add(watermill.LogFields{"completed_offsets": tail.Len(), "ranges": len(tail.Ranges)}))
}

// ignoreMetadata counts and logs commit metadata that is not trusted.
func (w *partitionWorker) ignoreMetadata(c committedOffset, why string) {
	w.mu.Lock()
	w.counters.ignoredMetadata++
	w.mu.Unlock()
	w.sub.logger.Info("Ignoring commit metadata; records after the committed offset are redelivered",
		w.logFields.Add(watermill.LogFields{"reason": why, "committed": c.offset}))
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
	var retry *time.Timer
	var retryC <-chan time.Time
	w.sub.partitions.Add(1)
	defer w.sub.partitions.Add(-1)
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		if marked, allDone := w.markIfAdvanced(false); marked && allDone && w.requestCommit != nil &&
			w.fetched.len() == 0 && len(messages) == 0 {
			// Every record received is complete and no more are waiting:
			// commit now rather than at the next interval.
			w.requestCommit()
		}

		// Take records while few are ready to hand out (so the in-flight
		// bound also bounds fetching), the tracker has room, and the tail
		// is not near its budget. Otherwise records wait in the fetched
		// queue, and fetching pauses once it holds a few.
		accepting := w.canAccept()
		for accepting && w.fetched.len() > 0 {
			w.accept(w.fetched.pop())
			accepting = w.canAccept()
		}
		w.fetchControl()

		// Fast paths without the full select, the common case under load:
		// hand out the next ready record if a token and a receiver are
		// there, or take the next fetched record if one is waiting.
		if w.tryHandOut() {
			continue
		}
		if accepting {
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
		if w.next != nil {
			out, next = w.sub.output, w.next.wm
		} else if w.wantsToken() {
			acquire = w.sub.tokens
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
			w.next = w.takeReady()
			if w.next == nil {
				w.sub.releaseToken() // acks handed the ready records out meanwhile
			}
		case out <- next:
			w.sent()
		case <-w.wake:
		case <-retryC:
			retry, retryC = nil, nil
			w.retryStuck()
		case <-stop:
			w.drain("stopped")
			return
		case <-w.ctx.Done():
			w.drain("context done")
			return
		}
	}
}

// canAccept reports whether run may take another record from the claim.
func (w *partitionWorker) canAccept() bool {
	if w.stuck != nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// paused: the completed tail nears its budget (PauseAtTailUsage).
	return !w.paused && w.ready.len() < w.readyAhead() && w.roomLocked()
}

// readyAhead is how many ready records run keeps queued: the partition's
// share of MaxInFlight, at most maxReadyAhead. More than the share could only
// be handed out with tokens of other partitions, so it would unmarshal
// records early and, measured, slows the others.
func (w *partitionWorker) readyAhead() int {
	return min(maxReadyAhead, w.tokenShare())
}

// tokenShare is the partition's fair share of MaxInFlight among the
// subscription's running partitions.
func (w *partitionWorker) tokenShare() int {
	return max(1, w.sub.cfg.MaxInFlight/max(1, int(w.sub.partitions.Load())))
}

// wantsToken reports whether run should wait for an in-flight token: a
// record is ready and the partition holds less than its share of the
// tokens. At its share, the partition's own acks pass their tokens on to
// its ready records (see completeAndContinue), so run waiting as well would
// only take turns with them; below it, waiting queues the partition for the
// next token any partition frees.
func (w *partitionWorker) wantsToken() bool {
	return int(w.holding.Load()) < w.tokenShare() && w.readyLen() > 0
}

func (w *partitionWorker) readyLen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready.len()
}

// tryHandOut hands out the next ready record when a token is free and a
// receiver waits, without blocking. It reports whether it did.
func (w *partitionWorker) tryHandOut() bool {
	if w.next == nil {
		if w.readyLen() == 0 {
			return false
		}
		select {
		case w.sub.tokens <- struct{}{}:
		default:
			return false
		}
		if w.next = w.takeReady(); w.next == nil {
			w.sub.releaseToken()
			return false
		}
	}
	select {
	case w.sub.output <- w.next.wm:
		w.sent()
		return true
	default:
		return false
	}
}

// takeReady pops the next ready record for a caller holding a token and
// gives it a fresh delivery context. It returns nil when none is ready or
// the assignment is ending. The record counts in flight from here.
func (w *partitionWorker) takeReady() *record {
	w.mu.Lock()
	if w.handedDone || w.ready.len() == 0 {
		w.mu.Unlock()
		return nil
	}
	r := w.ready.pop()
	w.inFlight++
	w.mu.Unlock()
	w.holding.Add(1)
	w.startDelivery(r)
	return r
}

// startDelivery gives the record's current delivery its context and stamps
// when it is handed out. Contexts are made only here, once a record starts,
// so records waiting for their key or in the ready queue cost none. The
// stamp is written before the send, so the handler reads it safely.
func (w *partitionWorker) startDelivery(r *record) {
	ctx := context.WithValue(w.parentCtx, recordCtxKey{}, r)
	if w.txn != nil {
		ctx = w.txn.newDelivery(ctx, r.wm)
	}
	ctx, cancel := context.WithCancel(ctx)
	r.wm.SetContext(ctx)
	r.cancel = cancel
	r.deliveredAt = time.Now()
}

// sent is called by run once the consumer took w.next.
func (w *partitionWorker) sent() {
	r := w.next
	w.next = nil
	w.awaiting.Add(1) // only run adds, and run is the one that waits
	go w.await(r)
}

// unsend takes back a record popped by takeReady that was never handed
// out, because the assignment ended first. It stays unfinished.
func (w *partitionWorker) unsend(r *record) {
	r.cancel()
	w.holding.Add(-1)
	w.sub.releaseToken()
	w.mu.Lock()
	w.inFlight--
	w.mu.Unlock()
	w.poke()
}

// maxReadyAhead bounds the records kept ready to hand out per partition. A
// few dozen let the acks' goroutines refill the handlers while run takes the
// next batch from the claim; more would only unmarshal records early.
const maxReadyAhead = 32

// Fetch flow control. The claim is always read (see run), so records the
// worker cannot take yet pile up in its fetched queue, and fetching is
// paused to bound it. Sarama, finding every partition of a broker paused,
// naps for 100 ms before it looks again; to keep that nap from starving the
// handlers, fetching resumes while the queue still holds resumeLead of
// records at the rate they are being taken, and pauses at twice that.
const (
	minResumeBelow = 64     // records; also the least that pauses fetching
	maxResumeBelow = 32_768 // records; bounds the queue at fast rates
	resumeLead     = 150 * time.Millisecond
	rateWindow     = 50 * time.Millisecond
)

// fetchControl pauses fetching while records wait unaccepted, and resumes
// it once few are left. The fetched queue is bounded by twice the resume
// threshold plus what the client had fetched before the pause took effect.
func (w *partitionWorker) fetchControl() {
	if w.pauser == nil || (!w.fetchPaused && w.fetched.len() < 2*minResumeBelow) {
		return
	}
	below := w.resumeBelow()
	switch {
	case !w.fetchPaused && w.fetched.len() >= 2*below:
		w.pauser.Pause(map[string][]int32{w.topic: {w.partition}})
		w.fetchPaused = true
	case w.fetchPaused && w.fetched.len() <= below:
		w.pauser.Resume(map[string][]int32{w.topic: {w.partition}})
		w.fetchPaused = false
	}
}

// resumeBelow returns how many fetched records last resumeLead at the rate
// records have been taken lately, within [minResumeBelow, maxResumeBelow].
func (w *partitionWorker) resumeBelow() int {
	now := time.Now()
	if w.rateFrom.IsZero() {
		w.rateFrom, w.rateCount = now, 0
	} else if d := now.Sub(w.rateFrom); d >= rateWindow {
		inst := float64(w.rateCount) / d.Seconds()
		if w.takeRate == 0 {
			w.takeRate = inst
		} else {
			w.takeRate = (w.takeRate + inst) / 2
		}
		w.rateFrom, w.rateCount = now, 0
	}
	n := int(w.takeRate * resumeLead.Seconds())
	return min(max(n, minResumeBelow), maxResumeBelow)
}

// roomLocked reports whether another record may be taken: the tracker has
// room and the ordering mode's read-ahead is not used up. Callers hold mu.
func (w *partitionWorker) roomLocked() bool {
	return w.tracker.Retained() < w.tracker.Capacity() && w.readAheadLeft()
}

// partitionReadAhead bounds the records taken ahead in OrderByPartition
// mode, and of key-less records in key mode. There, every record waits for
// the one before it, so reading further ahead adds no concurrency, only
// memory; in key mode a deep read-ahead is what lets other keys pass a busy
// one.
const partitionReadAhead = 16

// readAheadLeft reports whether the ordering mode lets another record be
// taken. Callers hold mu.
func (w *partitionWorker) readAheadLeft() bool {
	switch w.sub.cfg.Ordering {
	case OrderByPartition:
		return w.gate.Waiting() < partitionReadAhead
	case OrderByKey:
		// Key-less records wait in one lane, as in partition mode. While
		// they are nearly all the partition holds (a stream without keys),
		// reading further ahead adds only memory; once other records are
		// held, it is what lets keyed ones pass a slow key-less one.
		lane := w.gate.WaitingFor(noKeyLane)
		return lane < partitionReadAhead || w.tracker.Retained()-lane >= partitionReadAhead
	}
	return true
}

// accept registers a record with the tracker before anything else sees it,
// so no completion can move the prefix past it.
func (w *partitionWorker) accept(m *sarama.ConsumerMessage) {
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

// fixStart starts the bookkeeping at the first record delivered, when
// Sarama resolved the start itself (Consumer.Offsets.Initial: a commit out
// of range, or no commit on a partition whose start Setup could not pin,
// see groupHandler.pinStarts). That record is where fetching
// really started, or the first one that exists after it (compaction,
// transaction markers). The position is committed before the record is
// handed out, so a group that delivered anything has an in-range commit at
// or before its oldest unfinished record: the next owner resumes there and
// does not fall back to Offsets.Initial, which at OffsetNewest would skip
// the record, and at OffsetOldest re-handle history.
//
// Marking and resetting both is what lands Sarama's offset exactly on the
// start: MarkOffset only moves forward (from no commit, or from a commit
// below the log start), ResetOffset only back (from a commit above the
// high-water mark, which Sarama keeps as its current offset).
func (w *partitionWorker) fixStart(first int64) {
	tracker, err := frontier.New(first, w.sub.cfg.MaxPendingPerPartition)
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
	if w.marker == nil {
		return
	}
	w.marker.MarkOffset(w.topic, w.partition, first, "")
	w.marker.ResetOffset(w.topic, w.partition, first, "")
	w.marker.Commit()
	w.sub.logger.Debug("Partition starts at its first record; committed that position", w.logFields)
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

// admit passes a prepared record through the ordering gate into the ready
// queue.
func (w *partitionWorker) admit(r *record) {
	key, ordered := w.orderingKey(r.msg)
	r.key, r.gated = key, ordered
	w.mu.Lock()
	if !ordered || w.gate.Admit(key, r) {
		w.ready.push(r)
	}
	w.mu.Unlock()
}

// noKeyLane is the gate key of records that must run one at a time in
// their partition: every record under OrderByPartition, and key-less ones
// under OrderByKey, which keep watermill-kafka's one-at-a-time order (its
// DefaultMarshaler sets no key). No real key hashes to it (see
// orderingKey), so a keyed record never waits for key-less ones or the
// reverse.
const noKeyLane uint64 = 0

// orderingKey returns the gate key of m, and false when m may run beside
// any other record.
func (w *partitionWorker) orderingKey(m *sarama.ConsumerMessage) (uint64, bool) {
	switch w.sub.cfg.Ordering {
	case OrderByPartition:
		return noKeyLane, true
	case Unordered:
		return 0, false
	}
	k := m.Key
	if f := w.sub.cfg.OrderingKey; f != nil {
		k = f(m)
	}
	if len(k) == 0 {
		return noKeyLane, true
	}
	h := maphash.Bytes(w.seed, k)
	if h == noKeyLane {
		// Share a lane with another key instead (a collision the gate
		// already allows: it only serializes more).
		h++
	}
	return h, true
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

// await turns the Acks and Nacks of the messages handed out on this
// goroutine into completions or redeliveries: first r's, then those of the
// records it hands out itself after an ack.
func (w *partitionWorker) await(r *record) {
	defer w.awaiting.Done()
	for r != nil {
		wm, cancel := r.wm, r.cancel
		acked, answered := w.waitAnswer(wm, cancel)
		if !answered {
			return
		}
		r = w.answered(r, wm, cancel, acked)
	}
}

// waitAnswer waits for the Ack or Nack of wm. The message's context does
// not end with the assignment: a handler still running when the drain
// starts may finish within DrainTimeout. Once the drain gives up (the
// assignment is abandoned), waitAnswer cancels the context, frees the
// token and reports answered false.
func (w *partitionWorker) waitAnswer(wm *message.Message, cancel context.CancelFunc) (acked, answered bool) {
	select {
	case <-wm.Acked():
		return true, true
	case <-wm.Nacked():
		return false, true
	case <-w.abandoned:
		cancel()
		w.holding.Add(-1)
		w.sub.releaseToken()
		return false, false
	}
}

func isDeferredDelivery(r *record, wm *message.Message) bool {
	c := r.deferred.Load()
	return c != nil && c.msg == wm
}

// answered handles the Ack or Nack of one delivery. After a plain ack it
// returns the next record it handed out in its place, if any.
func (w *partitionWorker) answered(r *record, wm *message.Message, cancel context.CancelFunc, acked bool) *record {
	cancel()
	w.holding.Add(-1)
	switch {
	case !acked:
		w.sub.releaseToken()
		if w.txn != nil {
			w.txn.nacked(wm)
		}
		w.nacked(r)
	case isDeferredDelivery(r, wm):
		// The handler handed the record to something asynchronous: the
		// ticket completes when its Completion is resolved. It stays
		// counted in flight so that a drain waits for it; run is woken to
		// hand out with the freed token.
		w.sub.releaseToken()
		w.poke()
	default:
		if w.txn != nil {
			w.txn.acked(r, wm) // outputs enter the transaction before the ticket completes
		}
		return w.completeAndContinue(r)
	}
	return nil
}

// completeAndContinue completes an acked record and, when the token it
// held is not wanted by a waiting partition, hands the next ready record out
// with it. This keeps handlers fed without waking the run loop for every
// record. It returns the record handed out, or nil.
func (w *partitionWorker) completeAndContinue(r *record) *record {
	if !w.sub.passToken() {
		w.complete(r, true)
		return nil
	}
	w.handout.RLock()
	defer w.handout.RUnlock()
	w.mu.Lock()
	w.inFlight--
	wake := w.completeLocked(r)
	var next *record
	if !w.handedDone && w.ready.len() > 0 {
		next = w.ready.pop()
		w.inFlight++
		w.holding.Add(1)
	}
	// Wake run to refill the ready queue once it runs low, rather than
	// for every record.
	wake = wake || w.ready.len() < w.readyAhead()/2
	w.mu.Unlock()
	if wake {
		w.poke()
	}
	if next == nil {
		w.sub.releaseToken()
		return nil
	}
	w.startDelivery(next)
	select {
	case w.sub.output <- next.wm:
		return next
	case <-w.ctx.Done():
		w.unsend(next)
		return nil
	}
}

// complete finishes a record's ticket; handedOut says whether it was
// counted in flight.
func (w *partitionWorker) complete(r *record, handedOut bool) {
	w.mu.Lock()
	if handedOut {
		w.inFlight--
	}
	w.completeLocked(r)
	w.mu.Unlock()
	w.poke()
}

// completeLocked completes r's ticket and lets the next record of its key
// through the gate into the ready queue. It reports whether run should be
// woken: the prefix may have moved for the first time since the last mark,
// or nothing is in flight (a drain waits for that). Callers hold mu.
func (w *partitionWorker) completeLocked(r *record) (wake bool) {
	if w.tracker.Complete(r.ticket) {
		wake = !w.dirty.Swap(true)
		if r.gated {
			if next, ok := w.gate.Release(r.key); ok {
				w.ready.push(next)
				// The lane just fell below the read-ahead bound: run
				// may take records again (see readAheadLeft).
				wake = wake || (r.key == noKeyLane && w.gate.WaitingFor(noKeyLane) == partitionReadAhead-1)
			}
		}
	}
	return wake || w.inFlight == 0
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
	// Redeliver first in line, with a fresh delivery: a copy of the
	// message (Copy drops the ack state); it gets a new context when
	// handed out.
	w.mu.Lock()
	if !w.handedDone {
		r.wm = r.wm.Copy()
		w.ready.pushFront(r)
	}
	w.mu.Unlock()
	w.poke()
}

// markIfAdvanced hands the completed prefix to Sarama when it changed,
// with the completed tail in the metadata. A tail is encoded when forced: by
// the session's commit loop just before each commit, once per commit
// interval (Sarama commits no more often), or by a drain. Unforced (run's
// call after completions), it marks a prefix with no completed record behind
// it, which needs no encoding, so a partition that keeps up is marked at
// once; a tail it encodes only when PauseAtTailUsage needs to know its size
// (see tailCheckDueLocked). It reports whether it marked, and whether every
// record taken so far is complete.
func (w *partitionWorker) markIfAdvanced(force bool) (marked, allDone bool) {
	if !w.dirty.Load() {
		return false, false
	}
	tailOn := w.marker != nil && !w.sub.cfg.DisableCompletedTail
	w.markMu.Lock()
	defer w.markMu.Unlock()
	w.mu.Lock()
	if tailOn && !force && w.tracker.Blocked() > 0 && !w.tailCheckDueLocked() {
		w.mu.Unlock()
		return false, false // the commit loop encodes the tail
	}
	if !w.dirty.Swap(false) {
		w.mu.Unlock()
		return false, false // marked by another caller meanwhile
	}
	safe, err := w.tracker.SafeOffset()
	if err != nil {
		w.mu.Unlock()
		return false, false
	}
	allDone = w.tracker.Retained() == 0
	w.accepted.dropBelow(safe) // keeps the log as short as the retained window
	if tailOn {
		w.rangeBuf = w.tracker.AppendCompleted(w.rangeBuf[:0])
		b := w.tracker.TailLenBound()
		w.tailRecheckAt = b + b/8 + 1
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
		marked = true
	case safe == prev && meta != w.lastMeta:
		// MarkOffset ignores a mark at or below Sarama's current offset, so
		// a tail that grew behind an unchanged head is written with
		// ResetOffset, which applies at or below it. It cannot move the
		// offset back: Sarama's offset is the start (a committed, in-range
		// offset, or the one fixStart committed) or an earlier mark, all at
		// most safe.
		w.marker.ResetOffset(w.topic, w.partition, safe, meta)
		marked = true
	}
	w.lastMeta = meta
	return marked, allDone
}

// encodeTail encodes the completed ranges in rangeBuf relative to safe,
// within the metadata budget, and updates the pause state. An empty tail
// costs nothing and is not counted as an encode. Callers hold markMu.
func (w *partitionWorker) encodeTail(safe int64) string {
	var buf []byte
	cut, encoded := false, len(w.rangeBuf) > 0
	budget := w.sub.cfg.TailMetadataBudget
	if encoded {
		var bound int64
		var err error
		buf, bound, err = frontier.AppendTail(w.tailBuf[:0], safe, w.rangeBuf, budget)
		if err != nil {
			// The tracker's ranges are valid by construction; if not, commit
			// plain offsets rather than anything doubtful.
			w.sub.logger.Error("Cannot encode the completed tail; committing the offset alone", err, w.logFields)
			buf = buf[:0]
		}
		w.tailBuf = buf
		cut = err == nil && bound != math.MaxInt64
	}
	pause := false
	if f := w.sub.cfg.PauseAtTailUsage; f > 0 && encoded {
		pause = cut || float64(len(buf)) >= f*float64(budget)
	}
	w.mu.Lock()
	if encoded {
		w.counters.tailEncodes++
	}
	w.tailBytes, w.tailCut = len(buf), cut
	resumed := w.setPausedLocked(pause)
	w.mu.Unlock()
	if resumed {
		w.poke() // run may take records again
	}
	return string(buf)
}

// tailCheckDueLocked is PauseAtTailUsage between commits: run asks it after
// completions behind an unfinished head, where the tail is otherwise left to
// the commit loop. The tracker's TailLenBound, O(1), bounds the encoded
// tail. Below the fraction of the budget, the tail is too: nothing to
// encode, and a paused partition resumes at once. At or above it, the tail
// may have reached the fraction, and it is encoded now (which decides the
// pause exactly) when the bound has grown by an eighth since the last
// encoding: a tail that keeps growing is encoded O(log) times, each costing
// O(retained), so the cost per completion stays constant. With
// PauseAtTailUsage zero it costs one comparison. Callers hold markMu and mu.
func (w *partitionWorker) tailCheckDueLocked() bool {
	f := w.sub.cfg.PauseAtTailUsage
	if f == 0 {
		return false
	}
	bound := w.tracker.TailLenBound()
	if float64(bound) < f*float64(w.sub.cfg.TailMetadataBudget) {
		w.setPausedLocked(false) // run, the caller, takes records next
		return false
	}
	return bound >= w.tailRecheckAt
}

// setPausedLocked sets the pause state (PauseAtTailUsage) and accounts the
// time paused. It reports whether the partition resumed. Callers hold markMu
// and mu.
func (w *partitionWorker) setPausedLocked(pause bool) (resumed bool) {
	if pause == w.paused {
		return false
	}
	now := time.Now()
	if pause {
		w.pausedAt = now
	} else {
		w.pausedFor += now.Sub(w.pausedAt)
	}
	w.paused = pause
	return !pause
}

// drain ends the assignment: nothing more is handed out, acks of the
// messages handed out are awaited up to DrainTimeout with their contexts
// alive, the final completed prefix is marked (and committed when commits
// are manual), the tracker is revoked so that later acks change nothing,
// and only then are the contexts of messages still unanswered cancelled.
// Cancelling first would turn work that could still finish into failures
// (and, behind a plain dead-letter middleware, into dead letters).
func (w *partitionWorker) drain(reason string) {
	w.cancel() // the assignment is ending; message contexts live on
	if w.next != nil {
		w.unsend(w.next)
		w.next = nil
	}
	// Stop the acks' goroutines from handing out more: the cancelled
	// context lets any that is sending give its record back, and once
	// handout is ours none is left.
	w.handout.Lock()
	w.mu.Lock()
	w.handedDone = true
	w.ready.clear()
	w.mu.Unlock()
	w.handout.Unlock()
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
	w.ready.clear()
	w.mu.Unlock()
	// Give up: the waiters cancel the contexts of messages still
	// unanswered. Waiting for them means Close and a revocation return
	// with every message context of the assignment ended.
	close(w.abandoned)
	w.awaiting.Wait()

	if w.marker != nil {
		// Sarama discards what is marked but not committed when a
		// partition is revoked: commit the final prefix now.
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
// front, for redeliveries. A queue that never empties (records keep
// arriving while earlier ones wait) would otherwise grow its slice by one
// slot per record ever pushed: push moves what is left to the front once
// at least half the slice has been popped, so the storage stays within
// about twice the most the queue held, at an amortized copy of one element
// per pop.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) push(v T) {
	if q.head > 0 && q.head >= len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:]) // popped slots are zeroed; these held moved values
		q.items, q.head = q.items[:n], 0
	}
	q.items = append(q.items, v)
}

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

func (q *fifo[T]) clear() {
	clear(q.items)
	q.items, q.head = q.items[:0], 0
}
