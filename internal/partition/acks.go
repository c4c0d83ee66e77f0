package partition

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

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
// goroutine into completions or redeliveries: first r's delivery wm (with
// its context's cancel), then those of the records it hands out itself
// after an ack. wm and cancel are read by the goroutine that handed the
// delivery out, before the send, never from r here: once the message is
// sent, a deferral resolved with an error and the router's Ack can
// redeliver r (a new r.wm and r.cancel, written by another goroutine)
// before this goroutine first runs.
func (w *Worker) await(r *Record, wm *message.Message, cancel context.CancelFunc) {
	defer w.awaiting.Done()
	for r != nil {
		a := w.waitAnswer(wm, cancel)
		if a == answerAbandoned {
			w.observe(r.obsState, OutcomeAbandoned, nil)
			return
		}
		r, wm, cancel = w.handleAnswer(r, wm, cancel, a == answerAck)
	}
}

// waitAnswer waits for the Ack or Nack of wm. The message's context does
// not end with the assignment: a handler still running when the drain
// starts may finish within DrainTimeout. Once the drain gives up (the
// assignment is abandoned), waitAnswer cancels the context and frees the
// token.
func (w *Worker) waitAnswer(wm *message.Message, cancel context.CancelFunc) answer {
	select {
	case <-wm.Acked():
		return answerAck
	case <-wm.Nacked():
		return answerNack
	case <-w.abandoned:
		cancel()
		w.tokensHeld.Add(-1)
		w.pool.release()
		return answerAbandoned
	}
}

// handleAnswer handles the Ack or Nack of one delivery. After a plain ack
// it returns the next record it handed out in its place, if any, with that
// delivery's message and cancel.
func (w *Worker) handleAnswer(r *Record, wm *message.Message, cancel context.CancelFunc, acked bool) (*Record, *message.Message, context.CancelFunc) {
	cancel()
	w.tokensHeld.Add(-1)
	switch {
	case !acked:
		if r.skipped.Load() {
			w.observe(r.obsState, OutcomeSkipped, nil)
		} else {
			w.observe(r.obsState, OutcomeNack, nil)
		}
		if w.hooks != nil {
			w.hooks.Nacked(wm, r.hookState)
		}
		w.nacked(r, w.pool.release)
	case r.deferredAtAck(wm):
		// The handler handed the record to something asynchronous: the
		// ticket completes when its Deferral is resolved. It stays
		// counted in flight so that a drain waits for it; run is woken to
		// hand out with the freed token.
		w.pool.release()
		w.wakeRun()
	default:
		if w.hooks != nil {
			w.hooks.Acked(r.msg, wm, r.hookState) // outputs enter the transaction before the ticket completes
		}
		w.observe(r.obsState, OutcomeAck, nil)
		return w.completeAndContinue(r)
	}
	return nil, nil, nil
}

// completeAndContinue completes an acked record and, when the token it
// held is not wanted by a waiting partition, hands the next ready record out
// with it. This keeps handlers fed without waking the run loop for every
// record. It returns the record handed out with its delivery's message and
// cancel (read before the send: see await), or nil.
func (w *Worker) completeAndContinue(r *Record) (*Record, *message.Message, context.CancelFunc) {
	if !w.pool.pass() {
		w.complete(r, true)
		return nil, nil, nil
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
		return nil, nil, nil
	}
	w.startDelivery(next)
	wm, cancel := next.wm, next.cancel
	select {
	case w.pool.output <- wm:
		return next, wm, cancel
	case <-w.ctx.Done():
		w.takeBack(next)
		return nil, nil, nil
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
