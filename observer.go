package safeack

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// Observer is told of a Subscriber's deliveries and commits, for tracing:
// package github.com/safeack/safeack/otel implements it with
// OpenTelemetry. Set it in SubscriberConfig.Observer (or
// ShareSubscriberConfig.Observer, which says what a ShareSubscriber
// reports); nil (the default) costs nothing. Its methods run on the
// subscriber's own goroutines, some while a partition waits for them:
// keep them quick, and never block or panic in them.
type Observer interface {
	// Delivered is called as a message is handed out: once per delivery,
	// so a record nacked and redelivered is delivered again. ctx is the
	// parent of the message's context; the context Delivered returns
	// takes its place, so that what it carries (a span) reaches the
	// handler through msg.Context(). The DeliveryObserver it returns (nil:
	// none) is told what became of the delivery.
	Delivered(ctx context.Context, d Delivery) (context.Context, DeliveryObserver)
	// Committed is called after each commit of the commit loop (once per
	// commit interval, and the early commits of a caught-up partition)
	// that sent a position not yet confirmed, once the positions were read
	// back; in transactional mode, after each transaction; and after the
	// final commit of an ending assignment (a revocation, Close), with
	// CommitEvent.Final set.
	Committed(c CommitEvent)
}

// Delivery is one delivery of a record, for Observer.Delivered.
type Delivery struct {
	// Group is the consumer group, empty without one; for a
	// ShareSubscriber, the share group.
	Group string
	// Record is the Kafka record. It is shared: do not modify it.
	Record *sarama.ConsumerMessage
	// Message is the Watermill message handed out.
	Message *message.Message
	// DeliveryCount is the share group delivery count of the record
	// (1 at its first delivery, one more after each release or
	// acquisition lock timeout) for a ShareSubscriber's delivery, whose
	// DeliveryObserver may also be a ShareDeliveryObserver. It is 0 for
	// a Subscriber's deliveries: a consumer group counts no deliveries.
	DeliveryCount int32
}

// DeliveryObserver is told what became of one delivery.
type DeliveryObserver interface {
	// Answered is called once the delivery is answered: OutcomeAck (the
	// record completed), OutcomeNack (it is redelivered; err is the error
	// given to a deferred Completion's Resolve, else nil), OutcomeSkipped
	// (SkipRevoked left it to the next owner), OutcomeAbandoned (the
	// assignment ended before an answer), or OutcomeDeferred (its handler
	// deferred the completion with Defer, before returning: Answered is
	// called again, with OutcomeNack when the router nacks the delivery,
	// else with OutcomeAck or OutcomeNack once the Completion is resolved;
	// never, when the assignment ends before that).
	Answered(o Outcome, err error)
}

// Outcome is what became of a message in its handler, as Telemetry sees
// it when the handler returns, or of a delivery, as a DeliveryObserver
// sees it.
type Outcome int

const (
	// OutcomeAck: the handler returned nil; the router acks.
	OutcomeAck Outcome = iota + 1
	// OutcomeNack: the handler returned an error or panicked, or nacked
	// the message itself; the record is redelivered.
	OutcomeNack
	// OutcomeDeferred: the handler returned nil after deferring the
	// completion (Defer, CompletionFromCtx); the record completes when
	// the Completion is resolved.
	OutcomeDeferred
	// OutcomeSkipped: SkipRevoked did not run the handler; the partition's
	// next owner handles the record.
	OutcomeSkipped
)

// String names the outcome.
func (o Outcome) String() string {
	switch o {
	case OutcomeAck:
		return "ack"
	case OutcomeNack:
		return "nack"
	case OutcomeDeferred:
		return "deferred"
	case OutcomeSkipped:
		return "skipped"
	case OutcomeAbandoned:
		return "abandoned"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// OutcomeAbandoned is what becomes of a delivery whose assignment ended
// (a revocation, Close) before it was answered, once DrainTimeout passed:
// the record is left for the partition's next owner. Only a
// DeliveryObserver sees it; Telemetry reports handlers that return.
const OutcomeAbandoned Outcome = OutcomeSkipped + 1

// CommitEvent describes one commit, for Observer.Committed.
type CommitEvent struct {
	// Topic and Group are the subscription's topic and consumer group.
	Topic, Group string
	// Transactional reports a commit made in a Kafka transaction (see
	// NewTxnSubscriber), in which Outputs messages were produced.
	Transactional bool
	Outputs       int
	// Start is when the commit was sent, and Duration how long the broker
	// took to answer it (a transaction: from its start to its commit or
	// failure).
	Start    time.Time
	Duration time.Duration
	// Partitions are the positions sent.
	Partitions []CommittedPartition
	// Final reports the last commit of an assignment of these partitions
	// (they were revoked, or the subscriber closes): its Partitions list
	// every partition whose assignment ended, with the last position the
	// subscriber tried to commit, even if an earlier commit sent it
	// already. Once the assignment ended, records acked later are not
	// committed by it. The positions the group coordinator holds (read
	// back until it did) come in one event with Err nil, those it did not
	// hold in time in another, whose Err wraps ErrCommitNotConfirmed; each
	// partition is in one of them. In transactional mode each partition's
	// event comes as its claim gives it up, after the drain's transaction
	// (an event of its own), with the position the group holds from the
	// assignment.
	Final bool
	// Err is nil when the commit took. Otherwise it is the transaction's
	// error, or wraps ErrCommitNotConfirmed: Sarama does not report a
	// refused commit, so the positions are read back after it, and a
	// partition held below what was sent (or not read back) means the
	// commit did not take; the next commit sends it again.
	Err error
}

// CommittedPartition is one partition's position in a commit.
type CommittedPartition struct {
	Partition int32
	// Offset is the position sent: the offset of the next record to
	// consume. TailBytes is the size of the completed tail in its commit
	// metadata (0 without one).
	Offset    int64
	TailBytes int

	tail frontier.Tail // decoded from the metadata sent
}

// Covers reports whether the position covers the record at offset: the
// record is below Offset, or completed in the tail the commit carries. A
// covered record is not handed out again by the next owner of the
// partition.
func (p CommittedPartition) Covers(offset int64) bool {
	return offset < p.Offset || p.tail.Contains(offset)
}

// ErrCommitNotConfirmed is wrapped by CommitEvent.Err when reading the
// committed positions back did not find what the commit sent.
var ErrCommitNotConfirmed = errors.New("safeack: commit not confirmed by the group coordinator")

// ConsumerGroup returns the consumer group the Subscriber was configured
// with, empty without one.
func (s *Subscriber) ConsumerGroup() string { return s.cfg.ConsumerGroup }

// observerAdapter is a subscription's partition.Observer over the
// configured Observer. It remembers, per partition, the last position the
// coordinator confirmed, so that a commit that sends nothing new (Sarama
// then sends no request) is not reported.
type observerAdapter struct {
	o     Observer
	group string

	mu        sync.Mutex
	confirmed map[int32]kclient.CommittedOffset
}

// partitionObserver returns the partition.Observer of a subscription, nil
// without an Observer.
func partitionObserver(o Observer, group string) partition.Observer {
	if o == nil {
		return nil
	}
	return &observerAdapter{o: o, group: group}
}

func (a *observerAdapter) Started(ctx context.Context, rec *sarama.ConsumerMessage, msg *message.Message) (context.Context, any) {
	ctx, d := a.o.Delivered(ctx, Delivery{Group: a.group, Record: rec, Message: msg})
	if d == nil {
		return ctx, nil
	}
	return ctx, d
}

func (a *observerAdapter) Answered(state any, o partition.Outcome, err error) {
	d := state.(DeliveryObserver)
	switch o {
	case partition.OutcomeAck:
		d.Answered(OutcomeAck, nil)
	case partition.OutcomeNack:
		d.Answered(OutcomeNack, err)
	case partition.OutcomeSkipped:
		d.Answered(OutcomeSkipped, nil)
	case partition.OutcomeDeferred:
		d.Answered(OutcomeDeferred, nil)
	case partition.OutcomeAbandoned:
		d.Answered(OutcomeAbandoned, nil)
	}
}

// commitObservation is one commit of the commit loop, observed: nil
// without an Observer (its methods then do nothing).
type commitObservation struct {
	a       *observerAdapter
	topic   string
	start   time.Time
	took    time.Duration
	workers []*partition.Worker
	sent    []kclient.CommittedOffset
}

// observeCommit starts observing a commit of the session's marks: call it
// just before sess.Commit, then sent after it and confirmed after the
// positions were read back.
func (h *groupHandler) observeCommit() *commitObservation {
	a, ok := h.sub.workerCfg.Observer.(*observerAdapter)
	if !ok {
		return nil
	}
	workers := h.workers.list()
	c := &commitObservation{a: a, topic: h.sub.topic}
	a.mu.Lock()
	for _, w := range workers {
		off, meta := w.MarkedPosition()
		if prev, ok := a.confirmed[w.Partition()]; off < 0 || ok && prev.Offset == off && prev.Metadata == meta {
			continue
		}
		c.workers = append(c.workers, w)
		c.sent = append(c.sent, kclient.CommittedOffset{Offset: off, Metadata: meta})
	}
	a.mu.Unlock()
	c.start = time.Now()
	return c
}

func (c *commitObservation) sentNow() {
	if c != nil {
		c.took = time.Since(c.start)
	}
}

// confirmed reports the commit, with the positions read back since.
func (c *commitObservation) confirmed() {
	if c == nil || len(c.workers) == 0 {
		return
	}
	ev := CommitEvent{Topic: c.topic, Group: c.a.group, Start: c.start, Duration: c.took,
		Partitions: make([]CommittedPartition, len(c.workers))}
	behind := 0
	c.a.mu.Lock()
	if c.a.confirmed == nil {
		c.a.confirmed = make(map[int32]kclient.CommittedOffset)
	}
	for i, w := range c.workers {
		p, sent := w.Partition(), c.sent[i]
		ev.Partitions[i] = committedPartition(p, sent.Offset, sent.Metadata)
		if w.Stats().ConfirmedOffset < sent.Offset {
			behind++
			continue
		}
		c.a.confirmed[p] = sent
	}
	c.a.mu.Unlock()
	if behind > 0 {
		ev.Err = &commitBehindError{partitions: behind}
	}
	c.a.o.Committed(ev)
}

// observeTxn reports a transaction of the transactional commit path.
func (sub *subscription) observeTxn(start time.Time, took time.Duration, marks map[int32]txnMark, outputs int, err error) {
	a, ok := sub.workerCfg.Observer.(*observerAdapter)
	if !ok {
		return
	}
	ev := CommitEvent{Topic: sub.topic, Group: a.group, Transactional: true, Outputs: outputs,
		Start: start, Duration: took, Err: err, Partitions: make([]CommittedPartition, 0, len(marks))}
	for p, mk := range marks {
		ev.Partitions = append(ev.Partitions, committedPartition(p, mk.offset, mk.metadata))
	}
	slices.SortFunc(ev.Partitions, func(x, y CommittedPartition) int { return cmp.Compare(x.Partition, y.Partition) })
	a.o.Committed(ev)
}

// observeFinal reports the final commit of assignments that ended, with
// the last position each one tried: one CommitEvent with Final set for
// the positions the group holds (held), and one whose Err wraps
// ErrCommitNotConfirmed (and cause, when not nil) for those it does not
// (notHeld). An Observer's spans of acked deliveries that neither covers
// end with it: those records are the next owner's to hand out again.
func (sub *subscription) observeFinal(start time.Time, took time.Duration, transactional bool,
	held, notHeld map[int32]kclient.CommittedOffset, cause error) {
	a, ok := sub.workerCfg.Observer.(*observerAdapter)
	if !ok {
		return
	}
	event := func(positions map[int32]kclient.CommittedOffset, err error) {
		if len(positions) == 0 {
			return
		}
		ev := CommitEvent{Topic: sub.topic, Group: a.group, Transactional: transactional, Final: true,
			Start: start, Duration: took, Err: err, Partitions: make([]CommittedPartition, 0, len(positions))}
		for p, c := range positions {
			ev.Partitions = append(ev.Partitions, committedPartition(p, c.Offset, c.Metadata))
		}
		slices.SortFunc(ev.Partitions, func(x, y CommittedPartition) int { return cmp.Compare(x.Partition, y.Partition) })
		a.o.Committed(ev)
	}
	if !transactional && len(held) > 0 {
		a.mu.Lock()
		if a.confirmed == nil {
			a.confirmed = make(map[int32]kclient.CommittedOffset)
		}
		for p, c := range held {
			a.confirmed[p] = c
		}
		a.mu.Unlock()
	}
	event(held, nil)
	event(notHeld, &finalNotCommittedError{partitions: len(notHeld), cause: cause})
}

// finalNotCommittedError is CommitEvent.Err of a final commit the group
// does not hold.
type finalNotCommittedError struct {
	partitions int
	cause      error // why, when known (nil: the read-back found an earlier position)
}

func (e *finalNotCommittedError) Error() string {
	msg := ErrCommitNotConfirmed.Error() + ": the final position of " + strconv.Itoa(e.partitions) + " partition(s) is not held"
	if e.cause != nil {
		msg += ": " + e.cause.Error()
	}
	return msg
}

func (e *finalNotCommittedError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrCommitNotConfirmed}
	}
	return []error{ErrCommitNotConfirmed, e.cause}
}

func committedPartition(partition int32, offset int64, metadata string) CommittedPartition {
	return CommittedPartition{Partition: partition, Offset: offset, TailBytes: len(metadata), tail: coverageOf(offset, metadata).tail}
}

// commitBehindError is CommitEvent.Err for a commit the read-back did not
// find.
type commitBehindError struct{ partitions int }

func (e *commitBehindError) Error() string {
	return ErrCommitNotConfirmed.Error() + ": " + strconv.Itoa(e.partitions) + " partition(s) held below the position sent"
}

func (e *commitBehindError) Unwrap() error { return ErrCommitNotConfirmed }
