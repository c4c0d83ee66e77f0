package safeack

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrNotSafeackMessage is returned for a message that was not delivered by
// a safeack Subscriber (its context carries no record).
var ErrNotSafeackMessage = errors.New("safeack: message was not delivered by a safeack subscriber")

// ErrAlreadyAnswered is returned by Defer for a message already acked or
// nacked: its fate is decided.
var ErrAlreadyAnswered = errors.New("safeack: message already acked or nacked")

// Completion is the handle of a record whose completion was deferred with
// Defer. The record's offset is not committed past until Done is called;
// Fail redelivers it. Resolving more than once is harmless: the first call
// wins. A Completion that is never resolved keeps its record pending (it
// shows in Stats as unfinished) and holds no goroutine.
type Completion struct {
	r        *record
	resolved atomic.Bool
}

// Defer detaches the completion of msg from its Ack. Call it in the
// handler before returning: the router's Ack then frees the handler slot
// (MaxInFlight) but the record stays unfinished until the returned
// Completion reports Done — for example once a batching writer made the
// effect durable. A message not delivered by a safeack Subscriber gives
// ErrNotSafeackMessage; one already acked or nacked gives
// ErrAlreadyAnswered.
func Defer(msg *message.Message) (*Completion, error) {
	r, ok := recordFromCtx(msg.Context())
	if !ok {
		return nil, ErrNotSafeackMessage
	}
	select {
	case <-msg.Acked():
		return nil, ErrAlreadyAnswered
	case <-msg.Nacked():
		return nil, ErrAlreadyAnswered
	default:
	}
	r.deferred.Store(true)
	r.owner.mu.Lock()
	r.owner.counters.deferred++
	r.owner.mu.Unlock()
	return &Completion{r: r}, nil
}

// Done completes the record: the completed prefix may move past it. After
// the partition was revoked it changes nothing.
func (c *Completion) Done() {
	if c == nil || !c.resolved.CompareAndSwap(false, true) {
		return
	}
	c.r.owner.complete(c.r, true)
}

// Fail redelivers the record after NackResendSleep, as a Nack would. The
// error is not kept; log it where it happened. After the partition was
// revoked it changes nothing.
func (c *Completion) Fail(error) {
	if c == nil || !c.resolved.CompareAndSwap(false, true) {
		return
	}
	c.r.owner.nacked(c.r)
}

// Offset returns the Kafka offset of the deferred record.
func (c *Completion) Offset() int64 { return c.r.msg.Offset }

// Partition returns the Kafka partition of the deferred record.
func (c *Completion) Partition() int32 { return c.r.msg.Partition }

// AssignmentEnded reports whether the partition assignment that delivered
// msg has ended (revoked in a rebalance, or the subscriber is closing).
// Work started for it now may be done again by the partition's next owner.
// It is false for messages not delivered by a safeack Subscriber.
func AssignmentEnded(msg *message.Message) bool {
	r, ok := recordFromCtx(msg.Context())
	return ok && r.owner.ctx.Err() != nil
}

// skipIfRevoked nacks msg without redelivery when its assignment ended
// before its handler started, so that the partition's next owner handles
// it and nothing is acked for it here. It reports whether it did.
func skipIfRevoked(msg *message.Message) bool {
	r, ok := recordFromCtx(msg.Context())
	if !ok || r.owner.ctx.Err() == nil {
		return false
	}
	r.skipped.Store(true)
	r.owner.mu.Lock()
	r.owner.counters.skippedRevoked++
	r.owner.mu.Unlock()
	msg.Nack()
	return true
}

// deliveredAt returns when msg was handed out, for telemetry.
func deliveredAt(msg *message.Message) (time.Time, bool) {
	r, ok := recordFromCtx(msg.Context())
	if !ok {
		return time.Time{}, false
	}
	return r.deliveredAt, true
}

// isDeferred reports whether the handler deferred msg's completion.
func isDeferred(msg *message.Message) bool {
	r, ok := recordFromCtx(msg.Context())
	return ok && r.deferred.Load()
}
