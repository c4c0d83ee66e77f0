package safeack

import (
	"context"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/sentinel"
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
	case OutcomeDeadLettered:
		return "dead-lettered"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// OutcomeAbandoned is what becomes of a delivery whose assignment ended
// (a revocation, Close) before it was answered, once DrainTimeout passed:
// the record is left for the partition's next owner. Only a
// DeliveryObserver sees it; Telemetry reports handlers that return.
const OutcomeAbandoned Outcome = OutcomeSkipped + 1

// OutcomeDeadLettered: the handler failed and PoisonQueue (safeack's, or
// Watermill's for messages of other subscribers) published the message to
// the dead-letter topic; the router acks it, and its record completes.
// Only Telemetry reports it (with the handler's error in
// CompletionEvent.Err); a DeliveryObserver sees the ack.
const OutcomeDeadLettered Outcome = OutcomeAbandoned + 1

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
var ErrCommitNotConfirmed = sentinel.ErrCommitNotConfirmed

// ConsumerGroup returns the consumer group the Subscriber was configured
// with, empty without one.
func (s *Subscriber) ConsumerGroup() string { return s.cfg.ConsumerGroup }

// observerAdapter is the partition.Observer of a subscription over the
// configured Observer. (Commits reach the Observer through the host, see
// host.Committed.)
type observerAdapter struct {
	o     Observer
	group string
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
