package partition

import (
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Deferral is a delivery whose completion was detached from its ack (see
// Record.Defer). Its resolution takes effect once the delivery is acked:
// resolved earlier, it waits for the router's answer; if the delivery is
// nacked instead, the Nack redelivers the record and the Deferral changes
// nothing. After the assignment is abandoned it changes nothing either.
type Deferral struct {
	r        *Record
	msg      *message.Message // the delivery whose completion is deferred
	state    any              // the delivery's DeliveryHooks state
	obsState any              // the delivery's Observer state
	resolved atomic.Bool
	handle   any
}

// Defer detaches the completion of delivery msg from its ack. Called again
// for the same delivery, it returns the same Deferral. newHandle, when not
// nil, makes the Deferral's Handle (the caller's type for it), once per
// Deferral. It returns false when msg was acked or nacked already: its fate
// is decided.
func (r *Record) Defer(msg *message.Message, newHandle func(*Deferral) any) (*Deferral, bool) {
	// deferMu makes the answered check and the store one step against the
	// ack's check (deferredAtAck): a Defer racing the router's Ack either
	// is seen by it or fails, never completes the record a second time.
	r.deferMu.Lock()
	defer r.deferMu.Unlock()
	if answered(msg) {
		return nil, false
	}
	if prev := r.deferred.Load(); prev != nil && prev.msg == msg {
		return prev, true // this delivery was deferred already
	}
	d := &Deferral{r: r, msg: msg, state: r.hookState, obsState: r.obsState}
	if newHandle != nil {
		d.handle = newHandle(d)
	}
	r.deferred.Store(d)
	// Told here, before the handler returns: the resolution can take
	// effect (apply) before the ack's waiter looks at the deferral.
	r.owner.observe(r.obsState, OutcomeDeferred, nil)
	r.owner.mu.Lock()
	r.owner.counters.deferred++
	r.owner.mu.Unlock()
	return d, true
}

// Deferred reports whether delivery msg's completion was deferred.
func (r *Record) Deferred(msg *message.Message) bool {
	d := r.deferred.Load()
	return d != nil && d.msg == msg
}

// deferredAtAck is Deferred for the waiter of delivery msg's ack, ordered
// with Defer (see there).
func (r *Record) deferredAtAck(msg *message.Message) bool {
	r.deferMu.Lock()
	defer r.deferMu.Unlock()
	return r.Deferred(msg)
}

// Handle returns the value Defer's newHandle made for the Deferral.
func (d *Deferral) Handle() any { return d.handle }

// Record returns the deferred record.
func (d *Deferral) Record() *Record { return d.r }

// Resolve completes the record (err nil) or redelivers it after
// NackResendSleep; the first call wins, later ones change nothing. It never
// blocks.
func (d *Deferral) Resolve(err error) {
	if !d.resolved.CompareAndSwap(false, true) {
		return
	}
	select {
	case <-d.msg.Acked():
		d.apply(err)
	case <-d.msg.Nacked():
		// The Nack redelivers the record: nothing to add.
	default:
		// Resolved before the handler returned: take effect when the
		// router answers. This goroutine ends with that answer or with
		// the assignment.
		go func() {
			select {
			case <-d.msg.Acked():
				d.apply(err)
			case <-d.msg.Nacked():
			case <-d.r.owner.abandoned:
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
	w := d.r.owner
	if w.hooks != nil {
		if err == nil {
			w.hooks.Acked(d.r.msg, d.msg, d.state)
		} else {
			w.hooks.Nacked(d.msg, d.state)
		}
	}
	if err == nil {
		w.observe(d.obsState, OutcomeAck, nil)
		w.complete(d.r, true)
		return
	}
	w.observe(d.obsState, OutcomeNack, err)
	go w.nacked(d.r, nil)
}
