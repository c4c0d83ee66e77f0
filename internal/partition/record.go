package partition

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	contract "github.com/safeack/safeack/internal/delivery"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/frontier"
)

// Record is one Kafka record on its way through a handler. Every message a
// worker hands out carries its Record in its context (see FromContext).
type Record struct {
	msg    *sarama.ConsumerMessage
	ticket frontier.Ticket
	owner  *Worker

	key   uint64
	gated bool // holds its key in the ordering gate until completed

	wm           *message.Message // the message of the current (or next) delivery
	deliveredAt  time.Time        // of the current delivery; written before it is handed out
	unmarshalErr error

	// current is the record's latest delivery, stored when it starts: an
	// unanswered delivery of the record is always its current one, since
	// the record is redelivered only after an answer. Defer and Deferred
	// find their message's delivery here.
	current atomic.Pointer[delivery]
	// first is the first delivery's state, kept here to save an allocation
	// per record; redeliveries allocate their own.
	first   delivery
	deferMu sync.Mutex // orders Defer with the ack's look at delivery.deferred
	// skipped is set when the record's handler was not run because its
	// assignment had ended; its Nack must not redeliver.
	skipped atomic.Bool
	// deadLettered is set when PoisonQueue published the record to a
	// dead-letter topic (see DeadLetter).
	deadLettered atomic.Bool
}

// delivery is one hand-out of a record. The waiter of its answer holds
// it from before the send, so what it finds here is this delivery's own,
// whatever later deliveries of the record did: a deferral that failed
// can redeliver the record, and the redelivery be deferred in turn,
// before the waiter of the acked delivery looks.
type delivery struct {
	r         *Record
	msg       *message.Message
	cancel    context.CancelFunc // of msg's context
	hookState any                // DeliveryHooks.Started's state
	obsState  any                // Observer.Started's state
	// deferred is set by Defer before the router answers msg: the ack
	// then leaves the ticket open until this Deferral is resolved. Written
	// under r.deferMu.
	deferred atomic.Pointer[Deferral]
}

// deferredAtAck reports, for the waiter of the delivery's ack, whether the
// delivery was deferred; r.deferMu orders it with Defer (see there).
func (dv *delivery) deferredAtAck() bool {
	dv.r.deferMu.Lock()
	defer dv.r.deferMu.Unlock()
	return dv.deferred.Load() != nil
}

// A message's context carries its *Record under the delivery contract's
// key (contract.ContextKey). One key for all record facts keeps message
// creation to a single context.WithValue.
var _ contract.Delivery = (*Record)(nil)

// FromContext returns the Record of the message whose context is ctx (or
// is derived from it), and false for a message no worker handed out.
func FromContext(ctx context.Context) (*Record, bool) {
	if ctx == nil {
		return nil, false
	}
	r, ok := ctx.Value(contract.ContextKey{}).(*Record)
	return r, ok
}

// Message returns the Kafka record.
func (r *Record) Message() *sarama.ConsumerMessage { return r.msg }

// DeliveredAt returns when the current delivery was handed out.
func (r *Record) DeliveredAt() time.Time { return r.deliveredAt }

// AssignmentEnded reports whether the assignment that delivered the record
// has started ending (revoked, or the subscriber is closing).
func (r *Record) AssignmentEnded() bool { return r.owner.ctx.Err() != nil }

// Skipped reports whether the record's handler was skipped because its
// assignment had ended (see SkipIfEnded).
func (r *Record) Skipped() bool { return r.skipped.Load() }

// DeadLetter logs, at Error level, that PoisonQueue published the record
// to the dead-letter topic for reason, and counts it: a dead letter is a
// record the application gave up on, which an operator must see (the
// router logs nothing, its handler having returned nil).
func (r *Record) DeadLetter(topic string, reason error) {
	if r.deadLettered.Swap(true) {
		return
	}
	r.owner.mu.Lock()
	r.owner.counters.deadLettered++
	r.owner.mu.Unlock()
	r.owner.cfg.Logger.Error("Record dead-lettered: published to the dead-letter topic and acked", reason,
		r.owner.logFields.Add(watermill.LogFields{"kafka_topic": r.msg.Topic, "kafka_partition_offset": r.msg.Offset, "dead_letter_topic": topic}))
}

// DeadLettered reports whether DeadLetter was called for the record.
func (r *Record) DeadLettered() bool { return r.deadLettered.Load() }

// SkipIfEnded nacks delivery msg without redelivery when its assignment
// ended before its handler started, so that the partition's next owner
// handles it and nothing is acked for it here. It reports whether it did.
func (r *Record) SkipIfEnded(msg *message.Message) bool {
	if !r.AssignmentEnded() || answered(msg) {
		return false // answered already (e.g. behind InstantAck): too late
	}
	r.skipped.Store(true)
	r.owner.mu.Lock()
	r.owner.counters.skippedRevoked++
	r.owner.mu.Unlock()
	msg.Nack()
	return true
}

// answered reports whether msg was acked or nacked.
func answered(msg *message.Message) bool {
	select {
	case <-msg.Acked():
		return true
	case <-msg.Nacked():
		return true
	default:
		return false
	}
}
