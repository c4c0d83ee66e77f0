package safeack

// Router middleware for handlers that run on a safeack Subscriber, in the
// order of the recommended chain, outermost first (the package
// documentation shows the chain): Telemetry, SkipRevoked, KafkaMetadata,
// PoisonQueue (in poison_queue.go: the dead-letter policy), and
// DeferredCompletion. Each passes messages of any other subscriber through.

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/safeack/safeack/internal/delivery"
	"github.com/safeack/safeack/internal/sentinel"
	"github.com/safeack/safeack/internal/share"
)

// ErrHandlerPanicked is CompletionEvent.Err for a handler that panicked
// through Telemetry (with middleware.Recoverer inside Telemetry, the
// handler returns a RecoveredPanicError instead).
var ErrHandlerPanicked = errors.New("safeack: handler panicked")

// CompletionEvent describes one run of a handler, reported by Telemetry.
type CompletionEvent struct {
	// FromSafeack reports that a safeack Subscriber delivered the message.
	// When false, Topic is the router's subscribe topic (empty outside a
	// router), Partition and Offset are -1, and DeliveredAt and Wait are
	// zero.
	FromSafeack bool
	Topic       string
	Partition   int32
	Offset      int64
	// UUID is the Watermill message UUID, Handler the router handler's
	// name (empty outside a router).
	UUID    string
	Handler string
	// DeliveredAt is when the subscriber handed the message out (as the
	// router took it from the subscription), and Wait the time from then
	// to the start of Telemetry's handler: time spent in the router and
	// in the middleware before Telemetry.
	DeliveredAt time.Time
	Wait        time.Duration
	// Duration is how long the handler (with the middleware inside
	// Telemetry) ran.
	Duration time.Duration
	Outcome  Outcome
	// Err is the handler's error, for OutcomeNack (nil when the handler
	// nacked the message itself) and OutcomeDeadLettered.
	Err error
}

// Telemetry is router middleware that calls hook once per handler run,
// after the handler returned (or panicked), with the message's Kafka
// position, the time from delivery to handler start, the handler's
// duration and its outcome. Add it once to the router to cover every
// handler. hook runs on the handler's goroutine while the message's slot
// is held: keep it quick, and do not let it panic.
//
// Outcomes are read as the handler returns: produced messages that then
// fail to publish turn an OutcomeAck into a Nack by the router, unseen
// here; and a PoisonQueue inside Telemetry turns the failures it
// dead-letters into OutcomeDeadLettered. Put Telemetry outermost to see
// skips (OutcomeSkipped) and every failure; inside Retry it reports every
// attempt.
//
// Messages of any other subscriber are reported too, with FromSafeack
// false (see CompletionEvent).
func Telemetry(hook func(CompletionEvent)) message.HandlerMiddleware {
	if hook == nil {
		panic("safeack: Telemetry with a nil hook")
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) (events []*message.Message, err error) {
			start := time.Now()
			ev := CompletionEvent{
				Topic:     message.SubscribeTopicFromCtx(msg.Context()),
				Partition: -1,
				Offset:    -1,
				UUID:      msg.UUID,
				Handler:   message.HandlerNameFromCtx(msg.Context()),
			}
			d, ours := delivery.FromContext(msg.Context())
			if ours {
				rec := d.Message()
				ev.FromSafeack = true
				ev.Topic, ev.Partition, ev.Offset = rec.Topic, rec.Partition, rec.Offset
				at := d.DeliveredAt()
				ev.DeliveredAt, ev.Wait = at, max(start.Sub(at), 0)
			}
			// A message of another subscriber is dead-lettered when
			// Watermill's PoisonQueue set its reason on the way out.
			poisonedBefore := msg.Metadata.Get(middleware.ReasonForPoisonedKey)
			returned := false
			defer func() {
				ev.Duration = time.Since(start)
				switch {
				case !returned:
					// Panicking: report, and let the panic go on to the
					// Recoverer or router that handles it.
					ev.Outcome, ev.Err = OutcomeNack, ErrHandlerPanicked
				case ours && d.Skipped() && answered(msg.Nacked()):
					ev.Outcome = OutcomeSkipped
				case err != nil:
					ev.Outcome, ev.Err = OutcomeNack, err
				case answered(msg.Nacked()):
					ev.Outcome = OutcomeNack
				case ours && d.Deferred(msg):
					ev.Outcome = OutcomeDeferred
				case ours && d.DeadLettered():
					ev.Outcome, ev.Err = OutcomeDeadLettered, deadLetterReason(msg)
				case !ours && msg.Metadata.Get(middleware.ReasonForPoisonedKey) != poisonedBefore:
					ev.Outcome, ev.Err = OutcomeDeadLettered, deadLetterReason(msg)
				default:
					ev.Outcome = OutcomeAck
				}
				hook(ev)
			}()
			events, err = h(msg)
			returned = true
			return events, err
		}
	}
}

// deadLetterReason is the handler's error of a dead-lettered message, as
// PoisonQueue wrote it into the message's metadata.
func deadLetterReason(msg *message.Message) error {
	return errors.New(msg.Metadata.Get(middleware.ReasonForPoisonedKey))
}

func answered(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// SkipRevoked is router middleware that does not run the handler for a
// message whose partition assignment ended (revoked in a rebalance, or the
// subscriber closing) after the message was delivered and before the
// handler started — for example while it waited in a throttling or
// concurrency-limiting middleware placed before SkipRevoked. Such a
// message is nacked without redelivery: nothing is acked for it, the
// committed offset stays before it, and the partition's next owner handles
// it. It is counted in SkippedRevoked (PartitionStats during the drain,
// Subscriber.Totals after it) and reported to Telemetry as
// OutcomeSkipped. Place it after (inside) any middleware that may delay
// the handler, and before (outside) any that does work.
//
// Messages of any other subscriber, and messages already acked or nacked,
// pass through unchanged.
func SkipRevoked(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if skipIfRevoked(msg) {
			// The message is nacked already; the router's Ack after a nil
			// return is a no-op, and nil keeps Retry and PoisonQueue out.
			return nil, nil
		}
		return h(msg)
	}
}

// Metadata keys set by KafkaMetadata. They match the log field names of
// watermill-kafka.
const (
	MetadataTopic     = "kafka_topic"
	MetadataPartition = "kafka_partition"
	MetadataOffset    = "kafka_partition_offset"
	MetadataKey       = "kafka_key"
)

// KafkaMetadata is router middleware that copies the Kafka topic,
// partition, offset and key (when not empty) of a message into its
// metadata, under MetadataTopic, MetadataPartition, MetadataOffset and
// MetadataKey, overwriting values of the same names (which, arriving from
// upstream, would describe another record; a key-less record's message
// has no MetadataKey). Placed outside PoisonQueue, it makes the
// dead-lettered copy say where the record came from. Partition and offset
// are decimal; the key is the raw bytes.
//
// Messages of any other subscriber pass through unchanged.
func KafkaMetadata(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if r, ok := recordFromCtx(msg.Context()); ok {
			if msg.Metadata == nil {
				msg.Metadata = make(message.Metadata)
			}
			msg.Metadata.Set(MetadataTopic, r.Topic)
			msg.Metadata.Set(MetadataPartition, strconv.FormatInt(int64(r.Partition), 10))
			msg.Metadata.Set(MetadataOffset, strconv.FormatInt(r.Offset, 10))
			if len(r.Key) > 0 {
				msg.Metadata.Set(MetadataKey, string(r.Key))
			} else {
				delete(msg.Metadata, MetadataKey) // an upstream record's
			}
		}
		return h(msg)
	}
}

// ErrNoDeferredCompletion is returned by CompletionFromCtx for a context
// that did not come through the DeferredCompletion middleware.
var ErrNoDeferredCompletion = errors.New("safeack: no deferred completion in context; add safeack.DeferredCompletion to the router or handler")

type completionCtxKey struct{}

// completionSlot is what DeferredCompletion puts into a message's context:
// the delivery, and the Completion once the handler took it.
type completionSlot struct {
	msg     *message.Message
	foreign bool // not delivered by a safeack Subscriber
	taken   atomic.Pointer[Completion]
}

// DeferredCompletion is router middleware that lets a handler, or code it
// calls with the message's context, take the message's completion with
// CompletionFromCtx and return at once — typically after handing the
// message's effect to an asynchronous batching writer. For a message of a
// safeack Subscriber the handler's return then frees its slot, and the
// record completes (the commit may pass it) only when the Completion
// reports Done; Fail redelivers it, as a Nack would. It is Defer, reachable
// from the context.
//
// With any other subscriber it works unchanged, at the cost of the slot:
// after the handler returned nil having taken the Completion, the
// middleware waits for it and returns nil on Done, the error on Fail, or
// the context's error when the message's context ends first.
//
// A handler that takes the Completion and then returns an error gets the
// error's usual treatment (retry, poison queue, Nack); if the delivery ends
// nacked, the Completion changes nothing. For a safeack message, every
// attempt of one delivery (under middleware.Retry) gets the same
// Completion, and once taken it decides for the delivery: when a later
// attempt returns nil without taking it, the record still waits for it.
// Put DeferredCompletion inside Retry.
//
// Behind middleware.InstantAck the message is acked before the handler
// runs, so CompletionFromCtx gives ErrAlreadyAnswered: InstantAck defeats
// the completed-prefix guarantee and must not be used with safeack.
func DeferredCompletion(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		_, ours := recordFromCtx(msg.Context())
		slot := &completionSlot{msg: msg, foreign: !ours}
		ctx := context.WithValue(msg.Context(), completionCtxKey{}, slot)
		msg.SetContext(ctx)
		events, err := h(msg)
		if ours || err != nil {
			return events, err
		}
		c := slot.taken.Load()
		if c == nil {
			return events, nil
		}
		select {
		case err := <-c.result:
			return events, err
		case <-ctx.Done():
			return events, ctx.Err()
		}
	}
}

// CompletionFromCtx returns the Completion of the message whose handler
// runs with ctx (see DeferredCompletion); every call for one delivery
// returns the same Completion, which is also the one Defer returns. It
// gives ErrNoDeferredCompletion when ctx did not come through
// DeferredCompletion, and ErrAlreadyAnswered when the message was acked or
// nacked already.
func CompletionFromCtx(ctx context.Context) (*Completion, error) {
	slot, ok := ctx.Value(completionCtxKey{}).(*completionSlot)
	if !ok {
		return nil, ErrNoDeferredCompletion
	}
	if c := slot.taken.Load(); c != nil {
		return c, nil
	}
	if !slot.foreign {
		c, err := Defer(slot.msg)
		if err != nil {
			return nil, err
		}
		slot.taken.CompareAndSwap(nil, c)
		return c, nil
	}
	select {
	case <-slot.msg.Acked():
		return nil, ErrAlreadyAnswered
	case <-slot.msg.Nacked():
		return nil, ErrAlreadyAnswered
	default:
	}
	slot.taken.CompareAndSwap(nil, &Completion{result: make(chan error, 1)})
	return slot.taken.Load(), nil
}

// ErrRejected is what RejectPoison wraps around the handler's error when it
// has the record rejected.
var ErrRejected = sentinel.ErrRejected

// RejectPoison is router middleware for a ShareSubscriber: a message whose
// handler fails is rejected, so the broker archives its record and never
// delivers it again; the handler's error, wrapped with ErrRejected, goes on
// to the router, which nacks the message. Place it outside
// middleware.Retry, so that only a record that failed every retry is
// rejected. A failure while the subscriber closes is not taken for
// poison: the record is released for another member. To dead-letter
// instead, use PoisonQueue (the record is then accepted once published).
// Messages of other subscribers pass through unchanged.
func RejectPoison(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d, ok := share.FromContext(msg.Context())
		events, err := h(msg)
		if err != nil && ok {
			err = d.Poison(msg, err)
		}
		return events, err
	}
}
