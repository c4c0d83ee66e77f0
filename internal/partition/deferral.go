package partition

import (
	"sync/atomic"

	contract "github.com/safeack/safeack/internal/delivery"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Deferral is a delivery whose completion was detached from its ack (see
// Record.Defer). Its resolution takes effect once the delivery is acked:
// resolved earlier, it waits for the router's answer; if the delivery is
// nacked instead, the Nack redelivers the record and the Deferral changes
// nothing. After the assignment is abandoned it changes nothing either.
type Deferral struct {
	delivery *delivery // the delivery whose completion is deferred
	resolved atomic.Bool
	handle   any
}

// Defer detaches the completion of delivery msg from its ack. Called again
// for the same delivery, it returns the same Deferral. newHandle, when not
// nil, makes the Deferral's Handle (the caller's type for it), once per
// Deferral. It returns false when msg was acked or nacked already: its fate
// is decided, or msg is not a delivery of r.
func (r *Record) Defer(msg *message.Message, newHandle func(contract.Deferral) any) (contract.Deferral, bool) {
	// deferMu makes the answered check and the store one step against the
	// ack's check (deferredAtAck): a Defer racing the router's Ack either
	// is seen by it or fails, never completes the record a second time.
	r.deferMu.Lock()
	defer r.deferMu.Unlock()
	if answered(msg) {
		return nil, false
	}
	// An unanswered delivery of r is r's current one: r is redelivered
	// only after an answer. Should msg be nacked since the check, its
	// redelivery may already be current (Defer fails), or the Deferral
	// goes to the nacked delivery (it changes nothing); an ack's waiter
	// waits for deferMu.
	dv := r.current.Load()
	if dv == nil || dv.msg != msg {
		return nil, false
	}
	if prev := dv.deferred.Load(); prev != nil {
		return prev, true // this delivery was deferred already
	}
	d := &Deferral{delivery: dv}
	if newHandle != nil {
		d.handle = newHandle(d)
	}
	dv.deferred.Store(d)
	// Told here, before the handler returns: the resolution can take
	// effect (apply) before the ack's waiter looks at the deferral.
	r.owner.observe(dv.obsState, OutcomeDeferred, nil)
	r.owner.mu.Lock()
	r.owner.counters.deferred++
	r.owner.mu.Unlock()
	return d, true
}

// Deferred reports whether delivery msg's completion was deferred. It
// answers for the record's current delivery, the one a handler runs
// with until the router answers it; for an earlier one it reports false.
func (r *Record) Deferred(msg *message.Message) bool {
	dv := r.current.Load()
	return dv != nil && dv.msg == msg && dv.deferred.Load() != nil
}

// Handle returns the value Defer's newHandle made for the Deferral.
func (d *Deferral) Handle() any { return d.handle }

// Record returns the deferred record.
func (d *Deferral) Record() *Record { return d.delivery.r }

// Resolve completes the record (err nil) or redelivers it after
// NackResendSleep; the first call wins, later ones change nothing. It never
// blocks.
func (d *Deferral) Resolve(err error) {
	if !d.resolved.CompareAndSwap(false, true) {
		return
	}
	msg := d.delivery.msg
	select {
	case <-msg.Acked():
		d.apply(err)
	case <-msg.Nacked():
		// The Nack redelivers the record: nothing to add.
	default:
		// Resolved before the handler returned: take effect when the
		// router answers. This goroutine ends with that answer or with
		// the assignment.
		go func() {
			select {
			case <-msg.Acked():
				d.apply(err)
			case <-msg.Nacked():
			case <-d.delivery.r.owner.abandoned:
			}
		}()
	}
}

// apply turns the resolution of an acked delivery into a completion or a
// redelivery. The record is still counted in flight (see handleAnswer). A
// redelivery waits NackResendSleep (or for the assignment's end) on a
// goroutine of its own, so that Resolve never blocks the caller, typically
// a batching writer.
func (d *Deferral) apply(err error) {
	dv := d.delivery
	w := dv.r.owner
	if w.hooks != nil {
		if err == nil {
			w.hooks.Acked(dv.r.msg, dv.msg, dv.hookState)
		} else {
			w.hooks.Nacked(dv.msg, dv.hookState)
		}
	}
	if err == nil {
		w.observe(dv.obsState, OutcomeAck, nil)
		w.complete(dv.r, true)
		return
	}
	w.observe(dv.obsState, OutcomeNack, err)
	go w.nacked(dv.r, nil)
}
