package safeack

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/safeack/safeack/internal/delivery"
)

// ErrAssignmentEnded is wrapped around a handler's error by PoisonQueue
// when it nacks the message instead of dead-lettering it, because the
// message's partition assignment ended (or its subscriber cancelled its
// context) before the handler gave up. The wrapped error is kept:
// errors.Is still finds, say, a driver's error.
//
// errors.Is(ErrAssignmentEnded, context.Canceled) reports true: the work
// was cancelled by the subscriber, not failed by the record. Watermill's
// Router therefore does not log it as "Handler returned error" (it skips
// cancellations), so a clean shutdown or rebalance logs no ERROR for the
// records it cut short; the router still nacks them.
var ErrAssignmentEnded error = assignmentEnded{}

type assignmentEnded struct{}

func (assignmentEnded) Error() string {
	return "safeack: assignment ended; not dead-lettered, left to the partition's next owner"
}

// Is makes the error a cancellation (see ErrAssignmentEnded).
func (assignmentEnded) Is(target error) bool { return target == context.Canceled }

// PoisonQueue is router middleware that dead-letters a message whose
// handler failed, as Watermill's middleware.PoisonQueue does (it publishes
// the message to topic with pub, with the reason_poisoned metadata, and
// returns nil so that the router acks it and its record completes) — but
// never a message whose failure may come from the subscriber ending the
// work rather than from the record:
//
//   - for a message of a safeack Subscriber: its partition assignment
//     ended (revoked in a rebalance, or the Subscriber closing; see
//     AssignmentEnded) before the handler gave up. This covers a handler
//     that returns its context's error once a drain gives up on it, and
//     one that fails while its assignment drains;
//   - for a message of any other subscriber: the message's context, as it
//     entered PoisonQueue, had ended when the handler gave up (Watermill
//     subscribers cancel it when they close).
//
// Such a message is nacked instead: the handler's error, wrapped with
// ErrAssignmentEnded, goes on to the router. Nothing is acked for it, the
// committed offset stays before it, and the partition's next owner
// handles it; a record that really is poison is dead-lettered there, after
// that owner's own retries.
//
// Each dead letter of a safeack message is logged by its subscriber at
// Error level (topic, partition, offset, the dead-letter topic and the
// handler's error), counted in PartitionCounters.DeadLettered (Stats,
// Totals, and the metrics and otel exporters), and reported to Telemetry
// as OutcomeDeadLettered. Error, because Watermill has no Warn level and a
// dead letter is work the application gave up on: the router logs nothing
// for it, the handler's error having become nil.
//
// Use it in place of middleware.PoisonQueue with a safeack Subscriber.
// Watermill's dead-letters a record that a rebalance or a shutdown cut
// short, although it is not poison: a handler that returns its context's
// error once the drain gave up has its record published to the
// dead-letter topic, and, its ack coming too late to count, handled again
// by the partition's next owner; a handler that fails during the drain
// (it stopped on AssignmentEnded, or a dependency was closing) has its
// record dead-lettered and acked in time, so it is never handled.
//
// Place it outside middleware.Retry, and keep middleware.Timeout inside it:
// a deadline set outside would look like the subscriber's cancellation.
func PoisonQueue(pub message.Publisher, topic string) (message.HandlerMiddleware, error) {
	return PoisonQueueWithFilter(pub, topic, nil)
}

// PoisonQueueWithFilter is PoisonQueue that dead-letters only errors for
// which shouldGoToPoisonQueue reports true, as Watermill's
// middleware.PoisonQueueWithFilter; other errors nack the message. A nil
// filter dead-letters every error. The filter is not asked about a
// failure that PoisonQueue leaves to the partition's next owner.
func PoisonQueueWithFilter(pub message.Publisher, topic string, shouldGoToPoisonQueue func(err error) bool) (message.HandlerMiddleware, error) {
	if pub == nil {
		return nil, errors.New("safeack: PoisonQueue with a nil publisher")
	}
	pq, err := middleware.PoisonQueueWithFilter(pub, topic, func(err error) bool {
		if errors.Is(err, ErrAssignmentEnded) {
			return false
		}
		return shouldGoToPoisonQueue == nil || shouldGoToPoisonQueue(err)
	})
	if err != nil {
		return nil, fmt.Errorf("safeack: %w", err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			// The subscriber's context, before middleware inside (Timeout,
			// Retry) replaces it with contexts of their own.
			entry := msg.Context()
			var failed error
			guarded := func(msg *message.Message) ([]*message.Message, error) {
				events, err := h(msg)
				if err != nil && !errors.Is(err, ErrAssignmentEnded) && endedBySubscriber(entry) {
					err = fmt.Errorf("%w: %w", ErrAssignmentEnded, err)
				}
				failed = err
				return events, err
			}
			events, err := pq(guarded)(msg)
			if failed != nil && err == nil {
				// The handler failed and Watermill's PoisonQueue published
				// the message: a dead letter, which the subscriber logs and
				// counts (see the delivery contract).
				if d, ok := delivery.FromContext(entry); ok {
					d.DeadLetter(topic, failed)
				}
			}
			return events, err
		}
	}, nil
}

// endedBySubscriber reports whether the subscriber ended the work of the
// message whose context, as delivered, is ctx. For a safeack message that
// is the end of its assignment: the context ends only after it (when the
// drain gives up), so a context that ended alone was ended by middleware
// outside PoisonQueue, which must not count.
func endedBySubscriber(ctx context.Context) bool {
	if d, ok := delivery.FromContext(ctx); ok {
		return d.AssignmentEnded() // for a ShareSubscriber: closing, or its Subscribe context ended
	}
	return ctx.Err() != nil
}
