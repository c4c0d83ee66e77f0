package safeack

import (
	"errors"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/internal/delivery"
	"github.com/safeack/safeack/internal/sentinel"
)

// ErrNotSafeackMessage is returned for a message that was not delivered by
// a safeack Subscriber (its context carries no record).
var ErrNotSafeackMessage = errors.New("safeack: message was not delivered by a safeack subscriber")

// ErrAlreadyAnswered is returned by Defer for a message already acked or
// nacked: its fate is decided.
var ErrAlreadyAnswered = sentinel.ErrAlreadyAnswered

// Completion is the handle of a record whose completion was deferred with
// Defer (or taken with CompletionFromCtx). The record's offset is not
// committed past until Done is called; Fail redelivers it. Resolving more
// than once is harmless: the first call wins. A Completion that is never
// resolved keeps its record pending (it shows in Stats as in flight and
// unfinished, and a revoked partition or Close waits DrainTimeout for it)
// and holds no goroutine.
//
// A Completion belongs to one delivery of its record. Its resolution takes
// effect once that delivery is acked (the handler returned nil): resolved
// earlier, it waits for the router's answer. If the delivery is nacked
// instead (the handler returned an error after deferring), the Nack
// redelivers the record and the Completion changes nothing. When the
// partition is revoked (or the Subscriber closes), its drain waits up to
// DrainTimeout for unresolved Completions and commits what they completed
// meanwhile; after that they change nothing, and the partition's next
// owner handles their records again.
type Completion struct {
	d   delivery.Deferral       // of the deferred delivery; nil for a message of another subscriber
	rec *sarama.ConsumerMessage // the deferred record
	// resolved and result serve a message of another subscriber:
	// DeferredCompletion waits on result before returning.
	resolved atomic.Bool
	result   chan error
}

// errFailedWithoutReason stands in for Fail(nil).
var errFailedWithoutReason = errors.New("safeack: deferred completion failed")

// Defer detaches the completion of msg from its Ack. Call it in the
// handler before returning: the router's Ack then frees the handler slot
// (MaxInFlight) but the record stays unfinished until the returned
// Completion reports Done — for example once a batching writer made the
// effect durable. Calling it again for the same delivery returns the same
// Completion; once deferred, the delivery's ack waits for it, even if a
// later retry of the handler (middleware.Retry) did not defer again. A
// message not delivered by a safeack Subscriber gives
// ErrNotSafeackMessage; one already acked or nacked (for example behind
// middleware.InstantAck) gives ErrAlreadyAnswered.
//
// For a message of a ShareSubscriber, Done accepts the record and Fail
// releases it (or rejects it at MaxDeliveries); until it is resolved the
// message counts as in flight and its member does not poll again (see
// ShareSubscriberConfig.MaxInFlight), its acquisition lock renewed.
func Defer(msg *message.Message) (*Completion, error) {
	dl, ok := delivery.FromContext(msg.Context())
	if !ok {
		return nil, ErrNotSafeackMessage
	}
	rec := dl.Message()
	d, ok := dl.Defer(msg, func(d delivery.Deferral) any { return &Completion{d: d, rec: rec} })
	if !ok {
		return nil, ErrAlreadyAnswered
	}
	return d.Handle().(*Completion), nil
}

// Done completes the record: the completed prefix may move past it.
func (c *Completion) Done() {
	c.resolve(nil)
}

// Fail redelivers the record after NackResendSleep, as a Nack would; it
// does not block. The error is not kept (log it where it happened),
// except under DeferredCompletion with another subscriber, where the
// handler returns it.
func (c *Completion) Fail(err error) {
	if err == nil {
		err = errFailedWithoutReason
	}
	c.resolve(err)
}

func (c *Completion) resolve(err error) {
	switch {
	case c == nil:
	case c.d != nil:
		c.d.Resolve(err)
	case c.resolved.CompareAndSwap(false, true):
		c.result <- err // capacity 1, sent once
	}
}

// Offset returns the Kafka offset of the deferred record, or -1 for a
// message of another subscriber.
func (c *Completion) Offset() int64 {
	if c.d == nil {
		return -1
	}
	return c.rec.Offset
}

// Partition returns the Kafka partition of the deferred record, or -1 for
// a message of another subscriber.
func (c *Completion) Partition() int32 {
	if c.d == nil {
		return -1
	}
	return c.rec.Partition
}

// AssignmentEnded reports whether the partition assignment that delivered
// msg has ended (revoked in a rebalance, or the subscriber is closing).
// Work started for it now may be done again by the partition's next owner.
// It turns true when the drain starts; the message's context stays alive
// until the drain gives up (DrainTimeout), and an ack before then still
// counts. It is false for messages not delivered by a safeack Subscriber.
func AssignmentEnded(msg *message.Message) bool {
	d, ok := delivery.FromContext(msg.Context())
	return ok && d.AssignmentEnded()
}

// skipIfRevoked nacks msg without redelivery when its assignment ended
// before its handler started, so that the partition's next owner handles
// it and nothing is acked for it here. It reports whether it did.
func skipIfRevoked(msg *message.Message) bool {
	d, ok := delivery.FromContext(msg.Context())
	return ok && d.SkipIfEnded(msg)
}
