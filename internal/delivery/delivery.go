// Package delivery is the contract between a record handed out by a
// safeack subscriber, in a consumer group (package partition) or a share
// group (package share), and the public helpers that act on it: deferred
// completion, the context helpers, the middleware and PoisonQueue. They
// name neither mode.
package delivery

import (
	"context"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Delivery is a record handed out, as the message whose context carries it
// (see FromContext) sees it.
type Delivery interface {
	// Message returns the Kafka record.
	Message() *sarama.ConsumerMessage
	// DeliveredAt returns when the current delivery was handed out.
	DeliveredAt() time.Time
	// AssignmentEnded reports whether the work that delivered the record
	// has started ending: its partition was revoked, or the subscriber is
	// closing. An ack may still count until the drain gives up.
	AssignmentEnded() bool
	// SkipIfEnded nacks delivery msg, leaving the record to the next
	// owner (a share group: to another member), when AssignmentEnded
	// before its handler started. It reports whether it did.
	SkipIfEnded(msg *message.Message) bool
	// Skipped reports whether SkipIfEnded skipped the record's handler.
	Skipped() bool
	// DeadLetter tells the subscriber that PoisonQueue published the
	// record to the dead-letter topic for reason (the router acks it
	// next): it logs it at Error level and counts it.
	DeadLetter(topic string, reason error)
	// DeadLettered reports whether DeadLetter was called for the record.
	DeadLettered() bool
	// Defer detaches the completion of delivery msg from its ack. Called
	// again for the same delivery, it returns the same Deferral.
	// newHandle makes the Deferral's Handle, once per Deferral. It
	// returns false when msg was acked or nacked already.
	Defer(msg *message.Message, newHandle func(Deferral) any) (Deferral, bool)
	// Deferred reports whether delivery msg deferred its completion.
	Deferred(msg *message.Message) bool
}

// Deferral is a delivery whose completion was detached from its ack.
type Deferral interface {
	// Handle returns what Defer's newHandle made for it.
	Handle() any
	// Resolve completes the record (err nil) or has it delivered again;
	// the first call wins. It never blocks.
	Resolve(err error)
}

// ContextKey is the context key of a message's Delivery. A message
// context of a type of its own answers it in Value.
type ContextKey struct{}

// FromContext returns the Delivery of the message whose context is ctx
// (or is derived from it), and false for a message no safeack subscriber
// handed out.
func FromContext(ctx context.Context) (Delivery, bool) {
	if ctx == nil {
		return nil, false
	}
	d, ok := ctx.Value(ContextKey{}).(Delivery)
	return d, ok
}
