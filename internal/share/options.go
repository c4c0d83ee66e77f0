package share

import (
	"context"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/ready"
)

// Options is what the subscriptions of one ShareSubscriber need of its
// configuration, built once from it with the defaults applied. The fields
// that come from the public config keep its names.
type Options struct {
	Brokers        []string
	ShareGroup     string
	Unmarshaler    kafka.Unmarshaler
	MaxInFlight    int
	MaxPollRecords int
	// WholeBatches: the broker acquires whole stored batches
	// (batch_optimized), not MaxPollRecords at most.
	WholeBatches     bool
	Members          int
	MaxDeliveries    int
	DeadLetter       func(ctx context.Context, msg *message.Message) error
	DeadLetterTarget DeadLetterTarget
	OnUnmarshalError func(ctx context.Context, msg *sarama.ConsumerMessage, err error) error
	InitialOffset    int64
	AckFlushInterval time.Duration
	DrainTimeout     time.Duration
	ClientOptions    []kgo.Opt
	// Observer is nil without a public Observer.
	Observer Observer
	Logger   watermill.LoggerAdapter
}

// DeadLetterTarget is the public ShareDeadLetterTarget, value for value.
type DeadLetterTarget int

// Dead-letter targets.
const (
	DeadLetterAuto DeadLetterTarget = iota
	DeadLetterBroker
	DeadLetterClient
)

// Host is the ShareSubscriber as its subscriptions see it.
type Host interface {
	// Closing is closed when the ShareSubscriber closes.
	Closing() <-chan struct{}
	// SetPhase tells readiness where a member of a subscription to topic
	// is; Ended that the member is gone.
	SetPhase(member any, topic string, p ready.Phase, err error)
	Ended(member any)
	// Registry is where the subscriptions count, for Stats.
	Registry() *Registry
}

// Observer is told of every delivery handed out (the ShareSubscriber's
// adapter over the public Observer).
type Observer interface {
	// Delivered returns the context of the delivery msg of rec, derived
	// from ctx, and what to tell of it (nil: nothing).
	Delivered(ctx context.Context, rec *sarama.ConsumerMessage, msg *message.Message, deliveryCount int32) (context.Context, DeliveryObserver)
}

// DeliveryObserver is told what became of one delivery.
type DeliveryObserver interface {
	// Deferred: the handler deferred the completion.
	Deferred()
	// Answered tells the acknowledgement given for the record and why
	// (err: the error that made it released or rejected, when known); it
	// reports whether the broker's answer is wanted (Acknowledged).
	Answered(status kgo.AckStatus, why Reason, err error) bool
	// Acknowledged tells the broker's answer to the acknowledgement (nil:
	// taken).
	Acknowledged(err error)
}

// Reason says why a delivery ended as it did, for Stats, logs and the
// Observer.
type Reason int

// Reasons of an acknowledgement.
const (
	Acked            Reason = iota
	Nacked                  // released
	RejectedPoison          // RejectPoison
	MaxDeliveries           // a Nack at MaxDeliveries, or received past it
	DeadLettered            // DeadLetter took it: accepted
	DeadLetterFailed        // DeadLetter failed: released
	UnmarshalFailed         // rejected, or released after OnUnmarshalError failed
	UnmarshalHandled        // OnUnmarshalError took it: accepted
	ReleasedAtClose
	Skipped     // SkipRevoked: the subscriber was closing
	LockExpired // its acquisition lock ended before it was handed out: released
	GivenBack   // it waited half its lock with no handler about to take it: released
)
