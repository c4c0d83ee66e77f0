package safeack

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// await turns the Acks and Nacks of the messages handed out on this
// goroutine into completions or redeliveries: first r's, then those of the
// records it hands out itself after an ack.
func (w *partitionWorker) await(r *record) {
	defer w.awaiting.Done()
	for r != nil {
		wm, cancel := r.wm, r.cancel
		acked, answered := w.waitAnswer(wm, cancel)
		if !answered {
			return
		}
		r = w.answered(r, wm, cancel, acked)
	}
}

// waitAnswer waits for the Ack or Nack of wm. The message's context does
// not end with the assignment: a handler still running when the drain
// starts may finish within DrainTimeout. Once the drain gives up (the
// assignment is abandoned), waitAnswer cancels the context, frees the
// token and reports answered false.
func (w *partitionWorker) waitAnswer(wm *message.Message, cancel context.CancelFunc) (acked, answered bool) {
	select {
	case <-wm.Acked():
		return true, true
	case <-wm.Nacked():
		return false, true
	case <-w.abandoned:
		cancel()
		w.holding.Add(-1)
		w.sub.releaseToken()
		return false, false
	}
}

func isDeferredDelivery(r *record, wm *message.Message) bool {
	c := r.deferred.Load()
	return c != nil && c.msg == wm
}

// answered handles the Ack or Nack of one delivery. After a plain ack it
// returns the next record it handed out in its place, if any.
func (w *partitionWorker) answered(r *record, wm *message.Message, cancel context.CancelFunc, acked bool) *record {
	cancel()
	w.holding.Add(-1)
	switch {
	case !acked:
		w.sub.releaseToken()
		if w.txn != nil {
			w.txn.nacked(wm)
		}
		w.nacked(r)
	case isDeferredDelivery(r, wm):
		// The handler handed the record to something asynchronous: the
		// ticket completes when its Completion is resolved. It stays
		// counted in flight so that a drain waits for it; run is woken to
		// hand out with the freed token.
		w.sub.releaseToken()
		w.poke()
	default:
		if w.txn != nil {
			w.txn.acked(r, wm) // outputs enter the transaction before the ticket completes
		}
		return w.completeAndContinue(r)
	}
	return nil
}

// completeAndContinue completes an acked record and, when the token it
// held is not wanted by a waiting partition, hands the next ready record out
// with it. This keeps handlers fed without waking the run loop for every
// record. It returns the record handed out, or nil.
func (w *partitionWorker) completeAndContinue(r *record) *record {
	if !w.sub.passToken() {
		w.complete(r, true)
		return nil
	}
	w.handout.RLock()
	defer w.handout.RUnlock()
	w.mu.Lock()
	w.inFlight--
	wake := w.completeLocked(r)
	var next *record
	if !w.handedDone && w.ready.len() > 0 {
		next = w.ready.pop()
		w.inFlight++
		w.holding.Add(1)
	}
	// Wake run to refill the ready queue once it runs low, rather than
	// for every record.
	wake = wake || w.ready.len() < w.readyAhead()/2
	w.mu.Unlock()
	if wake {
		w.poke()
	}
	if next == nil {
		w.sub.releaseToken()
		return nil
	}
	w.startDelivery(next)
	select {
	case w.sub.output <- next.wm:
		return next
	case <-w.ctx.Done():
		w.unsend(next)
		return nil
	}
}

// complete finishes a record's ticket; handedOut says whether it was
// counted in flight.
func (w *partitionWorker) complete(r *record, handedOut bool) {
	w.mu.Lock()
	if handedOut {
		w.inFlight--
	}
	w.completeLocked(r)
	w.mu.Unlock()
	w.poke()
}

// completeLocked completes r's ticket and lets the next record of its key
// through the gate into the ready queue. It reports whether run should be
// woken: the prefix may have moved for the first time since the last mark,
// or nothing is in flight (a drain waits for that). Callers hold mu.
func (w *partitionWorker) completeLocked(r *record) (wake bool) {
	if w.tracker.Complete(r.ticket) {
		wake = !w.dirty.Swap(true)
		if r.gated {
			if next, ok := w.gate.Release(r.key); ok {
				w.ready.push(next)
				// The lane just fell below the read-ahead bound: run
				// may take records again (see readAheadLeft).
				wake = wake || (r.key == noKeyLane && w.gate.WaitingFor(noKeyLane) == partitionReadAhead-1)
			}
		}
	}
	return wake || w.inFlight == 0
}

func (w *partitionWorker) nacked(r *record) {
	w.mu.Lock()
	w.inFlight--
	if !r.skipped.Load() {
		w.counters.redeliveries++
	}
	w.mu.Unlock()
	w.poke()
	if r.skipped.Load() {
		return // left unfinished for the partition's next owner
	}
	if d := w.sub.cfg.NackResendSleep; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-w.ctx.Done():
			t.Stop()
			return
		}
	}
	if w.ctx.Err() != nil {
		return
	}
	// Redeliver first in line, with a fresh delivery: a copy of the
	// message (Copy drops the ack state); it gets a new context when
	// handed out.
	w.mu.Lock()
	if !w.handedDone {
		r.wm = r.wm.Copy()
		w.ready.pushFront(r)
	}
	w.mu.Unlock()
	w.poke()
}
