package safeack

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/frontier"
)

// record is one delivered Kafka record on its way through a handler.
type record struct {
	msg    *sarama.ConsumerMessage
	ticket frontier.Ticket
	owner  *partitionWorker

	key   uint64
	gated bool // holds its key in the ordering gate until completed

	wm           *message.Message // the current delivery
	cancel       context.CancelFunc
	deliveredAt  time.Time // of the current delivery; written before it is handed out
	unmarshalErr error

	// deferred is set by Defer before the handler returns: when it holds
	// the Completion of the delivery being acked, the router's Ack leaves
	// the ticket open until that Completion is resolved. It is compared
	// per delivery, never reset: a Completion of an earlier, nacked
	// delivery must not hold back (or complete) a later one.
	deferred atomic.Pointer[Completion]
	// skipped is set when the record's handler was not run because its
	// assignment had ended; its Nack must not redeliver.
	skipped atomic.Bool
}
