package safeack

import (
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/internal/partition"
)

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
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

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
	// Err is the handler's error, for OutcomeNack; nil when the handler
	// nacked the message itself.
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
// here; and a PoisonQueue inside Telemetry turns failures into
// OutcomeAck. Put Telemetry outermost to see skips (OutcomeSkipped) and
// every failure; inside Retry it reports every attempt.
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
			r, ours := partition.FromContext(msg.Context())
			if ours {
				rec := r.Message()
				ev.FromSafeack = true
				ev.Topic, ev.Partition, ev.Offset = rec.Topic, rec.Partition, rec.Offset
				at := r.DeliveredAt()
				ev.DeliveredAt, ev.Wait = at, max(start.Sub(at), 0)
			}
			sd, shared := shareFromContext(msg.Context())
			if shared {
				ev.FromSafeack = true
				ev.Topic, ev.Partition, ev.Offset = sd.rec.Topic, sd.rec.Partition, sd.rec.Offset
				ev.DeliveredAt, ev.Wait = sd.handedAt, max(start.Sub(sd.handedAt), 0)
			}
			returned := false
			defer func() {
				ev.Duration = time.Since(start)
				switch {
				case !returned:
					// Panicking: report, and let the panic go on to the
					// Recoverer or router that handles it.
					ev.Outcome, ev.Err = OutcomeNack, ErrHandlerPanicked
				case (ours && r.Skipped() || shared && sd.skipped.Load()) && answered(msg.Nacked()):
					ev.Outcome = OutcomeSkipped
				case err != nil:
					ev.Outcome, ev.Err = OutcomeNack, err
				case answered(msg.Nacked()):
					ev.Outcome = OutcomeNack
				case ours && r.Deferred(msg) || shared && sd.deferredFor(msg):
					ev.Outcome = OutcomeDeferred
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

func answered(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
