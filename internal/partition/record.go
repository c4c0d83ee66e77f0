package partition

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
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

	wm           *message.Message // the current delivery
	hookState    any              // DeliveryHooks.Started's state of the current delivery
	obsState     any              // Observer.Started's state of the current delivery
	cancel       context.CancelFunc
	deliveredAt  time.Time // of the current delivery; written before it is handed out
	unmarshalErr error

	// deferred is set by Defer before the handler returns: when it holds
	// the Deferral of the delivery being acked, the router's Ack leaves the
	// ticket open until that Deferral is resolved. It is compared per
	// delivery, never reset: a Deferral of an earlier, nacked delivery must
	// not hold back (or complete) a later one.
	deferred atomic.Pointer[Deferral]
	deferMu  sync.Mutex // orders Defer with the ack's look at deferred
	// skipped is set when the record's handler was not run because its
	// assignment had ended; its Nack must not redeliver.
	skipped atomic.Bool
}

// recordKey is the context key of a message's *Record. One key for all
// record facts keeps message creation to a single context.WithValue.
type recordKey struct{}

// FromContext returns the Record of the message whose context is ctx (or
// is derived from it), and false for a message no worker handed out.
func FromContext(ctx context.Context) (*Record, bool) {
	if ctx == nil {
		return nil, false
	}
	r, ok := ctx.Value(recordKey{}).(*Record)
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
