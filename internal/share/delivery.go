package share

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/delivery"
	"github.com/safeack/safeack/internal/sentinel"
)

// deliveryCtx is a message's context: its own cancellation (Context) and
// the delivery for the context helpers. It lives inside the delivery, so
// a message costs no allocation of its own for it.
type deliveryCtx struct {
	context.Context
	d *Delivery
}

func (c *deliveryCtx) Value(key any) any {
	if _, ok := key.(delivery.ContextKey); ok {
		return c.d
	}
	return c.Context.Value(key)
}

// Delivery is one delivery of a share group record.
type Delivery struct {
	sub    *Subscription
	m      *member // the member that took the record
	rec    *kgo.Record
	cm     *sarama.ConsumerMessage
	msg    *message.Message
	cancel context.CancelFunc
	ctx    deliveryCtx
	// ctr holds the counters of the record's partition (stats.mu).
	ctr      *Counters
	handedAt time.Time
	// lockSpan is what was left of the acquisition lock when the record
	// was polled; renewAt when to renew it next. Member loop only.
	lockSpan time.Duration
	renewAt  time.Time
	// deadline is when the record's acquisition lock ends (unix
	// nanoseconds, 0 unknown): the poll's deadline, moved on when the
	// broker confirms a renewal.
	deadline atomic.Int64

	// unmarshalErr: the Unmarshaler refused the record, to be passed to
	// OnUnmarshalError (with unmarshalCtx) by handOut, not handed out.
	unmarshalErr error
	unmarshalCtx context.Context

	// status is zero until the record is answered, then the kgo ack
	// status sent: the first answer wins.
	status atomic.Int32
	done   chan struct{}

	// pastMax: received past MaxDeliveries, to be dead-lettered by
	// handOut, not handed out.
	pastMax bool

	// reject makes a Nack reject the record (RejectPoison); skipped says
	// SkipRevoked did not run its handler.
	reject, skipped atomic.Bool
	// deadLettered: PoisonQueue published the record (DeadLetter).
	deadLettered atomic.Bool

	// obs is told what became of the delivery (nil without an Observer,
	// or when it returned none).
	obs DeliveryObserver

	deferMu  sync.Mutex
	deferral *deferral
	answered bool  // the router acked or nacked
	nackErr  error // for obs: the error that made the record nacked, when known
}

// newDelivery makes the delivery of r, taken at polled (as kgo buffered
// it, or as the member's poll returned it) from a fetch sent at fetched:
// its acquisition lock's deadline and span noted for renewal. The poll
// that takes it counts it (received).
func (sub *Subscription) newDelivery(m *member, r *kgo.Record, fetched, polled time.Time) *Delivery {
	d := &Delivery{sub: sub, m: m, rec: r, cm: saramaMessage(r), done: make(chan struct{})}
	d.ctr = sub.stats.count(r.Topic, r.Partition, func(*Counters) {})
	// kgo counts the lock from when it decoded the fetch's answer; the
	// broker counted it from the acquisition, before it answered and
	// after the fetch was sent. Counted from the send, the deadline is
	// not later than the broker's: an ack given past it is reported
	// unconfirmed, never one the broker may have given away taken for
	// sure.
	if deadline := r.AcquisitionDeadline(); !deadline.IsZero() {
		deadline = deadline.Add(-polled.Sub(fetched))
		d.lockSpan = deadline.Sub(polled)
		d.renewAt = polled.Add(d.lockSpan / 2)
		d.deadline.Store(deadline.UnixNano())
		m.halfLock = d.lockSpan / 2
	}
	return d
}

// received counts d's record as received, once its member's poll took it.
func (sub *Subscription) received(d *Delivery) {
	n := d.rec.DeliveryCount()
	sub.stats.update(d.ctr, func(c *Counters) {
		c.Received++
		if n > 1 {
			c.Redelivered++
		}
		c.MaxDeliveryCount = max(c.MaxDeliveryCount, n)
	})
}

// prepare unmarshals d's record and reports whether d is to be handed
// out (or, past MaxDeliveries or refused by the Unmarshaler with an
// OnUnmarshalError, dealt with beside the poll by handOut); a record
// answered at once gives false.
func (sub *Subscription) prepare(d *Delivery) bool {
	r, cm := d.rec, d.cm
	msg, err := sub.cfg.Unmarshaler.Unmarshal(cm)
	if err != nil {
		sub.stats.update(d.ctr, func(c *Counters) { c.UnmarshalFailures++ })
		if sub.cfg.OnUnmarshalError == nil {
			sub.logger.Error("Cannot unmarshal record; rejecting it", err, d.fields())
			d.finish(kgo.AckReject, UnmarshalFailed)
			return false
		}
		// OnUnmarshalError may take long or wait on its context: handOut
		// runs it beside the poll, whose wait renews the record's lock,
		// and the drain's end cancels its context.
		d.unmarshalErr = err
		d.unmarshalCtx, d.cancel = context.WithCancel(sub.msgCtx)
		return true
	}
	pastMax := int(r.DeliveryCount()) > sub.cfg.MaxDeliveries
	parent := sub.msgCtx
	if obs := sub.cfg.Observer; obs != nil && !pastMax {
		// A record past MaxDeliveries is not handed out: no delivery
		// to observe.
		parent, d.obs = obs.Delivered(parent, cm, msg, r.DeliveryCount())
	}
	ctx, cancel := context.WithCancel(parent)
	d.ctx = deliveryCtx{Context: ctx, d: d}
	msg.SetContext(&d.ctx)
	d.msg, d.cancel = msg, cancel
	if pastMax {
		sub.logger.Info("Record received past MaxDeliveries; not handed out", d.fields())
		if sub.cfg.DeadLetter == nil || sub.brokerDLQ != "" {
			d.giveUp()
			return false
		}
		// DeadLetter may fail and be tried again while the record is
		// held: handOut runs it beside the batch, whose wait renews the
		// record's lock.
		d.pastMax = true
	}
	return true
}

// unmarshalFailed passes a record the Unmarshaler refused to
// OnUnmarshalError: accepted when it succeeds; when it fails, released, or
// rejected at MaxDeliveries (released, a record at the broker's delivery
// count limit would be archived unseen).
func (d *Delivery) unmarshalFailed() {
	cfg := d.sub.cfg
	herr := cfg.OnUnmarshalError(d.unmarshalCtx, d.cm, d.unmarshalErr)
	if herr == nil {
		d.finish(kgo.AckAccept, UnmarshalHandled)
		return
	}
	if d.status.Load() != 0 {
		return // released by the drain meanwhile
	}
	if int(d.rec.DeliveryCount()) >= cfg.MaxDeliveries {
		d.sub.logger.Error("OnUnmarshalError failed at MaxDeliveries; rejecting the record", herr, d.fields())
		d.finish(kgo.AckReject, UnmarshalFailed)
		return
	}
	d.sub.logger.Error("OnUnmarshalError failed; releasing the record", herr, d.fields())
	d.finish(kgo.AckRelease, UnmarshalFailed)
}

// expired reports whether less than margin (at most a quarter of the
// lock) is left of d's acquisition lock at now, as far as the broker
// confirmed its renewals.
func (d *Delivery) expired(now time.Time, margin time.Duration) bool {
	dl := d.deadline.Load()
	return dl != 0 && now.Add(min(margin, d.lockSpan/4)).UnixNano() >= dl
}

func saramaMessage(r *kgo.Record) *sarama.ConsumerMessage {
	cm := &sarama.ConsumerMessage{
		Topic:     r.Topic,
		Partition: r.Partition,
		Offset:    r.Offset,
		Key:       r.Key,
		Value:     r.Value,
		Timestamp: r.Timestamp,
	}
	for _, h := range r.Headers {
		cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return cm
}

func (d *Delivery) fields() watermill.LogFields {
	return watermill.LogFields{"partition": d.rec.Partition, "offset": d.rec.Offset, "delivery_count": d.rec.DeliveryCount()}
}

// watch turns the router's answer into the record's. The handler d's
// message held is free once the router answered (a deferred completion,
// a dead letter sent after a Nack hold none) or d was answered without it
// (the drain).
func (d *Delivery) watch() {
	select {
	case <-d.msg.Acked():
		d.sub.freeHandler()
		if df := d.answer(); df != nil {
			df.ackedNow()
			return
		}
		d.finish(kgo.AckAccept, Acked)
	case <-d.msg.Nacked():
		d.sub.freeHandler()
		d.answer()
		d.nacked()
	case <-d.done:
		d.sub.freeHandler()
	}
}

// answer notes the router's answer and cancels the message's context; it
// returns the deferral the Ack must wait for, if any.
func (d *Delivery) answer() *deferral {
	d.deferMu.Lock()
	d.answered = true
	df := d.deferral
	d.deferMu.Unlock()
	d.cancel()
	return df
}

// nacked releases the record, or gives up on it at MaxDeliveries.
func (d *Delivery) nacked() {
	if d.reject.Load() {
		d.finish(kgo.AckReject, RejectedPoison)
		return
	}
	if int(d.rec.DeliveryCount()) >= d.sub.cfg.MaxDeliveries {
		d.giveUp()
		return
	}
	d.finish(kgo.AckRelease, Nacked)
}

// giveUp rejects a record past MaxDeliveries (for the share group's dead-letter
// topic at the broker when chooseDeadLetter chose it, or without
// DeadLetter), or dead-letters it. A failing
// DeadLetter is tried again, with backoff, while the record stays held
// (its lock renewed like any unanswered record's), until it succeeds or
// the subscription stops: released then, a record at the broker's
// delivery count limit would be archived by the broker, neither handled
// nor dead-lettered, and with the defaults (MaxDeliveries is the broker's
// default limit) every record reaching DeadLetter is at that limit.
func (d *Delivery) giveUp() {
	cfg := d.sub.cfg
	if dlq := d.sub.brokerDLQ; dlq != "" {
		d.sub.logger.Error("Record reached MaxDeliveries; rejecting it for the share group's dead-letter topic at the broker", nil,
			d.fields().Add(watermill.LogFields{"dead_letter_topic": dlq}))
		d.finish(kgo.AckReject, MaxDeliveries)
		return
	}
	if cfg.DeadLetter == nil {
		d.sub.logger.Error("Record reached MaxDeliveries; rejecting it", nil, d.fields())
		d.finish(kgo.AckReject, MaxDeliveries)
		return
	}
	var pace backoff.Doubling
	for {
		err := cfg.DeadLetter(d.sub.msgCtx, d.msg)
		if err == nil {
			d.finish(kgo.AckAccept, DeadLettered)
			return
		}
		if d.status.Load() != 0 {
			return // released by the drain meanwhile
		}
		wait := pace.Next()
		if !backoff.Sleep(d.sub.stop, wait) {
			d.sub.logger.Error("DeadLetter failed and the subscription is stopping; releasing the record "+
				"(at the broker's delivery count limit the broker archives it)", err, d.fields())
			d.finish(kgo.AckRelease, DeadLetterFailed)
			return
		}
		d.sub.logger.Error("DeadLetter failed; holding the record and trying again", err,
			d.fields().Add(watermill.LogFields{"retry_in": wait.String()}))
	}
}

// finish answers the record once: the first call wins.
func (d *Delivery) finish(status kgo.AckStatus, why Reason) {
	if !d.status.CompareAndSwap(0, int32(status)) {
		return
	}
	late := d.lateAck(time.Now())
	d.rec.Ack(status)
	if late != nil {
		d.sub.logger.Error("Share acknowledgement given after the record's acquisition lock ended; not confirmed", late,
			d.fields().Add(watermill.LogFields{"ack": status.String()}))
	}
	d.observeAnswer(status, why, late)
	d.sub.acked.Store(true)
	if status == kgo.AckRelease && d.ended() {
		d.sub.releasedStopping.Store(true)
	}
	if d.cancel != nil {
		d.cancel()
	}
	d.sub.untrack(d)
	d.sub.stats.update(d.ctr, func(c *Counters) {
		switch status {
		case kgo.AckAccept:
			c.Accepted++
		case kgo.AckRelease:
			c.Released++
		case kgo.AckReject:
			c.Rejected++
		}
		if late != nil {
			c.AckErrors++
		}
		switch why {
		case DeadLettered:
			c.DeadLettered++
		case ReleasedAtClose:
			c.ReleasedAtClose++
		case GivenBack:
			c.GivenBack++
		case Skipped:
			c.SkippedClosing++
		}
	})
	close(d.done)
}

// ended reports whether the subscription stopped handing out: its
// ShareSubscriber is closing or Subscribe's context ended.
func (d *Delivery) ended() bool { return d.sub.stop.Err() != nil }

// The delivery contract (package delivery), for the public helpers.
var _ delivery.Delivery = (*Delivery)(nil)

func (d *Delivery) Message() *sarama.ConsumerMessage { return d.cm }

func (d *Delivery) DeliveredAt() time.Time { return d.handedAt }

// AssignmentEnded: a share delivery's work ends when its subscription stops
// handing out.
func (d *Delivery) AssignmentEnded() bool { return d.ended() }

func (d *Delivery) SkipIfEnded(msg *message.Message) bool { return d.skipIfClosing(msg) }

func (d *Delivery) Skipped() bool { return d.skipped.Load() }

// DeadLetter logs, at Error level, that PoisonQueue published the record
// to the dead-letter topic for reason, and counts it (see the delivery
// contract).
func (d *Delivery) DeadLetter(topic string, reason error) {
	if d.deadLettered.Swap(true) {
		return
	}
	d.sub.stats.update(d.ctr, func(c *Counters) { c.DeadLettered++ }) // accepted next, by the router's ack
	d.sub.logger.Error("Record dead-lettered: published to the dead-letter topic and acked", reason,
		d.fields().Add(watermill.LogFields{"topic": d.rec.Topic, "dead_letter_topic": topic}))
}

func (d *Delivery) DeadLettered() bool { return d.deadLettered.Load() }

func (d *Delivery) Deferred(msg *message.Message) bool { return d.deferredFor(msg) }

// FromContext returns the share delivery of the message whose context is
// ctx (or is derived from it).
func FromContext(ctx context.Context) (*Delivery, bool) {
	if ctx == nil {
		return nil, false
	}
	d, ok := ctx.Value(delivery.ContextKey{}).(*Delivery)
	return d, ok
}

// DeliveryCount returns the record's share group delivery count.
func (d *Delivery) DeliveryCount() int32 { return d.rec.DeliveryCount() }

// deferral is the deferred completion of a share delivery.
type deferral struct {
	d      *Delivery
	handle any

	mu        sync.Mutex
	resolved  bool
	result    error
	routerAck bool
}

// Defer detaches the completion of delivery msg from its ack: Done
// accepts the record, Fail releases it (see the delivery contract).
func (d *Delivery) Defer(msg *message.Message, newHandle func(delivery.Deferral) any) (delivery.Deferral, bool) {
	d.deferMu.Lock()
	if d.deferral != nil {
		d.deferMu.Unlock()
		return d.deferral, true
	}
	if d.answered || d.msg != msg || d.status.Load() != 0 {
		d.deferMu.Unlock()
		return nil, false
	}
	df := &deferral{d: d}
	df.handle = newHandle(df)
	d.deferral = df
	d.deferMu.Unlock()
	d.sub.stats.update(d.ctr, func(c *Counters) { c.Deferred++ })
	if d.obs != nil {
		d.obs.Deferred()
	}
	return df, true
}

// Handle returns what Defer's newHandle made for the deferral.
func (df *deferral) Handle() any { return df.handle }

// Resolve accepts the record (err nil) or releases it, once the router
// acked the delivery; the first call wins.
func (df *deferral) Resolve(err error) {
	df.mu.Lock()
	if df.resolved {
		df.mu.Unlock()
		return
	}
	df.resolved, df.result = true, err
	apply := df.routerAck
	df.mu.Unlock()
	if apply {
		df.apply(err)
	}
}

func (df *deferral) ackedNow() {
	df.mu.Lock()
	df.routerAck = true
	apply, err := df.resolved, df.result
	df.mu.Unlock()
	if apply {
		df.apply(err)
	}
}

func (df *deferral) apply(err error) {
	if err == nil {
		df.d.finish(kgo.AckAccept, Acked)
		return
	}
	df.d.setNackErr(err)
	df.d.nacked()
}

// setNackErr keeps, for the DeliveryObserver, the error that makes the
// delivery nacked; the first one stays.
func (d *Delivery) setNackErr(err error) {
	d.deferMu.Lock()
	if d.nackErr == nil {
		d.nackErr = err
	}
	d.deferMu.Unlock()
}

// Poison has the record of delivery msg rejected when its handler failed
// with err (RejectPoison), unless the subscription stopped handing out (a
// failure while closing is not taken for poison): it returns err wrapped
// with sentinel.ErrRejected then, else err.
func (d *Delivery) Poison(msg *message.Message, err error) error {
	if d.msg != msg || d.ended() {
		return err
	}
	err = fmt.Errorf("%w: %w", sentinel.ErrRejected, err)
	d.setNackErr(err)
	d.reject.Store(true)
	return err
}

// skipIfClosing nacks msg, releasing its record, when its ShareSubscriber
// is closing before its handler started. It reports whether it did.
func (d *Delivery) skipIfClosing(msg *message.Message) bool {
	if !d.ended() || d.msg != msg {
		return false
	}
	d.deferMu.Lock()
	answered := d.answered
	d.deferMu.Unlock()
	if answered {
		return false
	}
	d.skipped.Store(true)
	d.finish(kgo.AckRelease, Skipped)
	msg.Nack()
	return true
}

// deferredFor reports whether delivery msg deferred its completion.
func (d *Delivery) deferredFor(msg *message.Message) bool {
	d.deferMu.Lock()
	defer d.deferMu.Unlock()
	return d.deferral != nil && d.msg == msg
}
