// Package partition is safeack's per-partition dispatcher. A Worker owns
// one assigned partition: it takes records from the claim, registers them
// with a frontier.Tracker before anything else sees them, passes them
// through the ordering gate into its ready queue, hands them out on the
// subscription's output, turns each answer into a completion or a
// redelivery, and marks the completed prefix. It knows nothing of consumer
// groups or sessions: the subscriber gives it the claim's channel, a Marker
// and a Pauser, and the Pool it shares with the subscription's other
// workers.
//
// The worker's state is split by who may touch it: the run loop alone
// reads the claim, flow-controls fetching and marks plain advances; the
// goroutines that wait for answers complete records and hand out the next
// ready one under mu; the session's commit loop marks completed tails under
// markMu.
package partition

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/keygate"
)

// Worker owns one assigned partition. Its run loop is the only goroutine
// that reads the claim and marks plain advances; answers reach it through
// the state under mu and a wake-up signal.
//
// Ready records are handed out by the run loop and, to keep the handlers
// fed without a round trip through it, by the goroutine that saw the
// previous ack: it passes its in-flight token on to the next ready record
// (see completeAndContinue). The run loop refills the ready queue a batch
// at a time.
type Worker struct {
	cfg       *Config
	pool      *Pool
	topic     string
	partition int32
	marker    Marker // nil without a consumer group
	hooks     DeliveryHooks
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

	wakeups chan struct{} // capacity 1: "state under mu changed"; see wakeRun

	// handOutGate is held shared by every goroutine sending on the output
	// outside the run loop; drain takes it exclusively to stop them before
	// the assignment ends (the output is closed after that).
	handOutGate sync.RWMutex

	mu      sync.Mutex
	tracker *frontier.Tracker
	gate    *keygate.Gate[*Record]
	// ready holds records that may start now, in hand-out order:
	// redeliveries first, then records the gate let through, then new
	// ones. Their message contexts are made when they are handed out.
	ready          fifo[*Record]
	handOutStopped bool         // the assignment is ending: nothing more is handed out
	inFlight       int          // handed out, not yet acked or nacked
	tokensHeld     atomic.Int32 // tokens held by this partition's unanswered messages
	prefixMayMove  atomic.Bool  // a completion since the last mark may have moved the prefix
	atShare        atomic.Bool  // run waits at its token share with records ready (see Pool.waitingAtShare)
	counters       counters
	marked         int64 // last offset marked; written by run
	confirmed      int64 // last offset the coordinator reported committed; -1 unknown
	listedHWM      int64 // the high-water mark as last listed (SetHighWaterMark); -1 unknown
	stuckShown     bool  // mirrors stuck != nil, for Stats
	paused         bool  // the tail nears its budget: run takes no records (see tailCheckDueLocked)
	pausedFor      time.Duration
	tailBytes      int  // size of the last encoded tail
	tailCut        bool // the last encoded tail did not fit whole
	accepted       acceptLog
	hwm            func() int64 // the claim's high-water mark; nil when unknown
	// startPending: Sarama resolved Consumer.Offsets.Initial itself, so
	// the tracker's start is an estimate until the first record (see
	// fixStart). Written by run under mu.
	startPending bool
	start        Start
	startHeld    func(offset int64) bool // Assignment.StartCommitted
	pinStart     bool                    // Assignment.PinStart; cleared by run once committed

	// Owned by run.
	claim       <-chan *sarama.ConsumerMessage // Run's; read while run waits elsewhere (see waitReadingClaim)
	stop        <-chan struct{}                // Run's
	pauser      Pauser                         // nil: fetching is never paused
	fetchPaused bool
	takeRate    float64                       // records/s taken from the fetched queue lately
	rateFrom    time.Time                     // start of the current rate window
	rateCount   int                           // records taken since rateFrom
	fetched     fifo[*sarama.ConsumerMessage] // taken from the claim, not yet accepted
	// firstRecords is Assignment.FirstRecords until they or the claim's
	// first record arrive; claimFrom is the lowest claim offset still
	// taken (the claim repeats the first records).
	firstRecords <-chan []*sarama.ConsumerMessage
	claimFrom    int64
	// received is the offset after the last record taken (see Received);
	// written by run, read by any goroutine.
	received atomic.Int64
	next     *delivery // of a record popped from ready with a token, being sent
	stuck    *Record   // a record the unmarshaler rejected; the partition waits on it
	// handedOutOnce: run has handed out a record in this assignment
	// (see handedOver).
	handedOutOnce bool
	// inheritedTail is the completed tail read back from the last commit:
	// records a previous owner completed, not delivered again.
	inheritedTail frontier.Tail
	// staleCommit is the group's commit when Sarama did not fetch from it
	// (out of range): fixStart takes what its tail says above the real
	// start. Its offset is -1 when there is none.
	staleCommit staleCommit

	// markMu serializes marking: run marks plain advances at once, the
	// session's commit loop marks completed tails once per commit interval.
	// It guards the fields below.
	markMu   sync.Mutex
	tailBuf  []byte
	rangeBuf []frontier.Range
	lastMeta string
	// leaderEpoch reads the partition's leader epoch (nil: not known);
	// epoch is the last one read, epochMeta the epoch-only metadata of
	// epochMetaOf. Under markMu.
	leaderEpoch func() int32
	epoch       int32
	epochMeta   string
	epochMetaOf int32
	// requestCommit asks the session to commit soon; nil without a group.
	requestCommit func()
	pausedAt      time.Time
	// tailRecheckAt: with PauseAtTailUsage, the tail is encoded between
	// commits once its TailLenBound reaches this (an eighth above the
	// bound at the last encoding).
	tailRecheckAt int

	// beforeDeferredCheck, when not nil, runs in an ack's waiter before it
	// asks whether the delivery was deferred: tests hold the waiter there
	// to order it with a deferral's resolution. Set before Run.
	beforeDeferredCheck func()
}

// counters count what happened over the assignment, under mu.
type counters struct {
	redeliveries      uint64
	unmarshalFailures uint64
	skippedRevoked    uint64
	skippedTail       uint64
	deadLettered      uint64
	ignoredMetadata   uint64
	logTruncations    uint64
	deferred          uint64
	tailEncodes       uint64
}

// New returns a worker for assignment a. Its context, and the contexts of
// the messages it hands out, derive from parent; cancelling parent ends
// the assignment.
func New(parent context.Context, cfg *Config, pool *Pool, a Assignment) (*Worker, error) {
	tracker, err := frontier.New(max(a.Start.Offset, 0), cfg.MaxPending)
	if err != nil {
		return nil, err
	}
	marked := a.Start.Offset
	if !a.Start.Resolved {
		marked = -1 // nothing is marked until the first record fixes the start
	}
	ctx, cancel := context.WithCancel(parent)
	w := &Worker{
		cfg:           cfg,
		pool:          pool,
		topic:         a.Topic,
		partition:     a.Partition,
		marker:        a.Marker,
		hooks:         a.Deliveries,
		pauser:        a.Pauser,
		hwm:           a.HighWaterMark,
		requestCommit: a.RequestCommit,
		leaderEpoch:   a.LeaderEpoch,
		epoch:         frontier.NoLeaderEpoch,
		startHeld:     a.StartCommitted,
		logFields:     cfg.LogFields.Add(watermill.LogFields{"kafka_partition": a.Partition, "kafka_initial_offset": a.Start.Offset}),
		ctx:           ctx,
		cancel:        cancel,
		parentCtx:     context.WithoutCancel(ctx),
		abandoned:     make(chan struct{}),
		wakeups:       make(chan struct{}, 1),
		tracker:       tracker,
		gate:          keygate.New[*Record](),
		marked:        marked,
		confirmed:     -1,
		listedHWM:     -1,
		startPending:  !a.Start.Resolved,
		staleCommit:   staleCommit{offset: -1},
		start:         a.Start,
		firstRecords:  a.FirstRecords,
		pinStart:      a.PinStart,
	}
	w.received.Store(-1)
	return w, nil
}

// Topic returns the assigned partition's topic.
func (w *Worker) Topic() string { return w.topic }

// Partition returns the assigned partition.
func (w *Worker) Partition() int32 { return w.partition }

// LogFields returns the fields the worker logs with.
func (w *Worker) LogFields() watermill.LogFields { return w.logFields }

// End ends the assignment: Run drains and returns. It is what a stale
// transactional epoch does, and it is safe to call at any time.
func (w *Worker) End() { w.cancel() }

// wakeRun tells the run loop that state under mu changed (a completion, a
// nack, a resumed tail). It never blocks: one pending signal is enough.
func (w *Worker) wakeRun() {
	select {
	case w.wakeups <- struct{}{}:
	default:
	}
}

// Run consumes the claim until it is closed (revoked), stop closes or the
// assignment ends, then drains. It returns after the final mark.
func (w *Worker) Run(claim <-chan *sarama.ConsumerMessage, stop <-chan struct{}) {
	w.claim, w.stop = claim, stop
	var retry *time.Timer
	var retryC <-chan time.Time
	w.pool.started(w)
	defer w.pool.stopped(w)
	if w.pinStart {
		w.pinStart = false
		w.fixStart(w.start.Offset)
	}
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		if marked, allDone := w.markIfAdvanced(false); marked && allDone && w.requestCommit != nil &&
			w.fetched.len() == 0 && len(claim) == 0 {
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
			case m, ok := <-claim:
				if !ok {
					w.drain("claim closed")
					return
				}
				if w.fromClaim(m) {
					w.accept(m)
				}
				continue
			default:
			}
		}

		var out chan<- *message.Message
		var acquire chan<- struct{}
		var next *message.Message
		if w.next != nil {
			out, next = w.pool.output, w.next.msg
		} else if w.wantsToken() {
			acquire = w.pool.tokens
		} else if w.readyLen() > 0 && !w.waitAtShare() {
			w.wakeRun() // a token is free: loop and take it (tryHandOut)
		}
		if w.stuck != nil && retryC == nil {
			retry = time.NewTimer(w.cfg.UnmarshalRetry)
			retryC = retry.C
		}

		// The claim is always read, even when nothing can be accepted: a
		// cooperative rebalance revokes a claim only by closing its
		// channel, and that must be seen at once.
		select {
		case m, ok := <-claim:
			if !ok {
				w.drain("claim closed")
				return
			}
			switch {
			case !w.fromClaim(m):
			case accepting && w.fetched.len() == 0:
				w.accept(m)
			default:
				w.fetched.push(m)
			}
		case recs := <-w.firstRecords:
			w.takeFirstRecords(recs)
		case acquire <- struct{}{}:
			w.next = w.takeReady()
			if w.next == nil {
				w.pool.release() // acks handed the ready records out meanwhile
			}
		case out <- next:
			w.handedOver()
		case <-w.wakeups:
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
		w.stopWaitingAtShare()
	}
}
