package safeack

import (
	"context"
	"hash/maphash"
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
