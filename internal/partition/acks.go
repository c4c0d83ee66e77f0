package partition

import (
	"github.com/safeack/safeack/internal/backoff"
)

// answer is what became of one delivery, as its waiter saw it.
type answer int

const (
	answerAck answer = iota
	answerNack
	// answerAbandoned: the drain gave up before the router answered.
	answerAbandoned
)

// await turns the Acks and Nacks of the messages handed out on this
// goroutine into completions or redeliveries: first delivery dv, then
// those of the records it hands out itself after an ack. Each delivery is
// taken by the goroutine that handed it out, before the send, never read
// from its record here: once the message is sent, a deferral resolved
// with an error and the router's Ack can redeliver the record (a new
// delivery, possibly deferred in turn) before this goroutine first runs.
func (w *Worker) await(dv *delivery) {
	defer w.awaiting.Done()
	for dv != nil {
		a := w.waitAnswer(dv)
		if a == answerAbandoned {
			w.observe(dv.obsState, OutcomeAbandoned, nil)
			return
		}
		dv = w.handleAnswer(dv, a == answerAck)
	}
}

// waitAnswer waits for the Ack or Nack of dv's message. The message's
// context does not end with the assignment: a handler still running when
// the drain starts may finish within DrainTimeout. Once the drain gives up
// (the assignment is abandoned), waitAnswer cancels the context and frees
// the token.
func (w *Worker) waitAnswer(dv *delivery) answer {
	select {
	case <-dv.msg.Acked():
		return answerAck
	case <-dv.msg.Nacked():
		return answerNack
	case <-w.abandoned:
		dv.cancel()
		w.tokensHeld.Add(-1)
		w.pool.release()
		return answerAbandoned
	}
}

// handleAnswer handles the Ack or Nack of delivery dv. After a plain ack
// it returns the delivery it handed out in its place, if any.
func (w *Worker) handleAnswer(dv *delivery, acked bool) *delivery {
	r := dv.r
	dv.cancel()
	w.tokensHeld.Add(-1)
	if acked && w.beforeDeferredCheck != nil {
		w.beforeDeferredCheck()
	}
	switch {
	case !acked:
		if r.skipped.Load() {
			w.observe(dv.obsState, OutcomeSkipped, nil)
		} else {
			w.observe(dv.obsState, OutcomeNack, nil)
		}
		if w.hooks != nil {
			w.hooks.Nacked(dv.msg, dv.hookState)
		}
		w.nacked(r, w.pool.release)
	case dv.deferredAtAck():
		// The handler handed the record to something asynchronous: the
		// ticket completes when its Deferral is resolved. It stays
		// counted in flight so that a drain waits for it; run is woken to
		// hand out with the freed token.
		w.pool.release()
		w.wakeRun()
	default:
		if w.hooks != nil {
			w.hooks.Acked(r.msg, dv.msg, dv.hookState) // outputs enter the transaction before the ticket completes
		}
		w.observe(dv.obsState, OutcomeAck, nil)
		return w.completeAndContinue(r)
	}
	return nil
}

// completeAndContinue completes an acked record and, when the token it
// held is not wanted by a waiting partition, hands the next ready record out
// with it. This keeps handlers fed without waking the run loop for every
// record. It returns the delivery handed out (taken before the send: see
// await), or nil.
func (w *Worker) completeAndContinue(r *Record) *delivery {
	if !w.pool.pass() {
		w.complete(r, true)
		return nil
	}
	w.handOutGate.RLock()
	defer w.handOutGate.RUnlock()
	w.mu.Lock()
	w.inFlight--
	wake := w.completeLocked(r)
	var next *Record
	if !w.handOutStopped && w.ready.len() > 0 && !w.ending() {
		next = w.ready.pop()
		w.inFlight++
		w.tokensHeld.Add(1)
	}
	// Wake run to refill the ready queue once it runs low, rather than
	// for every record.
	wake = wake || w.ready.len() < w.readyAhead()/2
	w.mu.Unlock()
	if wake {
		w.wakeRun()
	}
	if next == nil {
		w.pool.release()
		return nil
	}
	dv := w.startDelivery(next)
	select {
	case w.pool.output <- dv.msg:
		return dv
	case <-w.ctx.Done():
		w.takeBack(dv)
		return nil
	}
}

// complete finishes a record's ticket; handedOut says whether it was
// counted in flight.
func (w *Worker) complete(r *Record, handedOut bool) {
	w.mu.Lock()
	if handedOut {
		w.inFlight--
	}
	w.completeLocked(r)
	w.mu.Unlock()
	w.wakeRun()
}

// completeLocked completes r's ticket and lets the next record of its key
// through the gate into the ready queue. It reports whether run should be
// woken: the prefix may have moved for the first time since the last mark,
// or nothing is in flight (a drain waits for that). Callers hold mu.
func (w *Worker) completeLocked(r *Record) (wake bool) {
	if w.tracker.Complete(r.ticket) {
		wake = !w.prefixMayMove.Swap(true)
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

// nacked takes a nacked (or failed deferred) delivery back and, unless its
// handler was skipped, redelivers the record first in line after
// NackResendSleep. releaseToken, if not nil, frees the delivery's
// in-flight token, once: before a NackResendSleep, so that other records
// run meanwhile; without one, only once the record is back in line, so
// that no other record takes the token before it.
func (w *Worker) nacked(r *Record, releaseToken func()) {
	released := releaseToken == nil
	release := func() {
		if !released {
			released = true
			releaseToken()
		}
	}
	defer release()
	w.mu.Lock()
	w.inFlight--
	if !r.skipped.Load() {
		w.counters.redeliveries++
	}
	w.mu.Unlock()
	if r.skipped.Load() {
		release()
		w.wakeRun()
		return // left unfinished for the partition's next owner
	}
	if d := w.cfg.NackResendSleep; d > 0 {
		release()
		w.wakeRun()
		if !backoff.Sleep(w.ctx, d) {
			return
		}
	}
	if w.ctx.Err() != nil {
		release()
		w.wakeRun()
		return
	}
	// Redeliver first in line, with a fresh delivery: a copy of the
	// message (Copy drops the ack state); it gets a new context when
	// handed out.
	w.mu.Lock()
	if !w.handOutStopped {
		r.wm = r.wm.Copy()
		w.ready.pushFront(r)
	}
	w.mu.Unlock()
	release()
	w.wakeRun()
}
