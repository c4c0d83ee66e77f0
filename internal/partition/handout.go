package partition

import (
	"context"
	"runtime"
	"time"

	contract "github.com/safeack/safeack/internal/delivery"
)

// maxReadyAhead bounds the records kept ready to hand out per partition. A
// few dozen let the acks' goroutines refill the handlers while run takes the
// next batch from the claim; more would only unmarshal records early.
const maxReadyAhead = 32

// readyAhead is how many ready records run keeps queued: the partition's
// share of MaxInFlight, at most maxReadyAhead. More than the share could only
// be handed out with tokens of other partitions, so it would unmarshal
// records early and, measured, slows the others.
func (w *Worker) readyAhead() int {
	return min(maxReadyAhead, w.tokenShare())
}

// tokenShare is the partition's fair share of MaxInFlight among the
// subscription's running partitions.
func (w *Worker) tokenShare() int { return w.pool.share() }

// wantsToken reports whether run should wait for an in-flight token: a
// record is ready and the partition holds less than its share of the
// tokens. At its share, the partition's own acks pass their tokens on to
// its ready records (see completeAndContinue), so run waiting as well would
// only take turns with them; below it, waiting queues the partition for the
// next token any partition frees.
func (w *Worker) wantsToken() bool {
	return int(w.tokensHeld.Load()) < w.tokenShare() && w.readyLen() > 0
}

func (w *Worker) readyLen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready.len()
}

// tryHandOut hands out the next ready record when a token is free and a
// receiver waits, without blocking. It reports whether it did.
func (w *Worker) tryHandOut() bool {
	if w.next == nil {
		if w.readyLen() == 0 {
			return false
		}
		select {
		case w.pool.tokens <- struct{}{}:
		default:
			return false
		}
		if w.next = w.takeReady(); w.next == nil {
			w.pool.release()
			return false
		}
	}
	select {
	case w.pool.output <- w.next.msg:
		w.handedOver()
		return true
	default:
		return false
	}
}

// takeReady pops the next ready record for a caller holding a token and
// starts its delivery. It returns nil when none is ready or the assignment
// is ending. The record counts in flight from here.
func (w *Worker) takeReady() *delivery {
	w.mu.Lock()
	if w.handOutStopped || w.ready.len() == 0 || w.ending() {
		w.mu.Unlock()
		return nil
	}
	r := w.ready.pop()
	w.inFlight++
	w.mu.Unlock()
	w.tokensHeld.Add(1)
	return w.startDelivery(r)
}

// ending reports whether the assignment is ending before the drain has
// begun (which stops hand-outs for good): stop closed or the context
// ended. Run sees them only in its select, which its fast paths skip
// while they find work, and the goroutines that saw an ack hand out
// without run: neither hands anything out from then on.
func (w *Worker) ending() bool {
	select {
	case <-w.stop:
		return true
	default:
	}
	select {
	case <-w.ctx.Done():
		return true
	default:
	}
	return false
}

// startDelivery starts a delivery of the record's message: it gives the
// message its context, stamps when it is handed out and makes the delivery
// the record's current one. Contexts are made only here, once a record
// starts, so records waiting for their key or in the ready queue cost none.
// Everything is written before the send, so the handler reads it safely.
func (w *Worker) startDelivery(r *Record) *delivery {
	dv := &r.first
	if r.current.Load() != nil {
		dv = &delivery{} // a redelivery: the earlier one's waiter may still hold its own
	}
	dv.r, dv.msg = r, r.wm
	ctx := context.WithValue(w.parentCtx, contract.ContextKey{}, r)
	if obs := w.cfg.Observer; obs != nil {
		ctx, dv.obsState = obs.Started(ctx, r.msg, dv.msg)
	}
	if w.hooks != nil {
		ctx, dv.hookState = w.hooks.Started(ctx, dv.msg)
	}
	ctx, dv.cancel = context.WithCancel(ctx)
	dv.msg.SetContext(ctx)
	r.deliveredAt = time.Now()
	r.current.Store(dv)
	return dv
}

// handedOver is called by run once the consumer took w.next: a goroutine
// waits for its answer.
//
// The first time, run yields before starting that goroutine. The consumer
// that took the message was parked on the output, and the send made it the
// next goroutine to run on this P; starting a goroutine takes that place
// and puts the consumer at the back of the run queue, behind whatever else
// is runnable. At start-up that is Sarama parsing the first fetch into
// every partition's channel, and the consumer saw its first message 3-75 ms
// after it was sent (issue 17, bench -wiretap with a probe at the send);
// watermill-kafka's sender blocks after its send and so does not push the
// consumer back. Later hand-outs do not yield: a yield moves run to the
// global run queue, and its cost in steady state was not measured across
// workloads.
func (w *Worker) handedOver() {
	// The delivery as run sent it, taken by takeReady: the record may
	// already be on a later delivery (see await).
	dv := w.next
	w.next = nil
	w.awaiting.Add(1) // only run adds, and run is the one that waits
	if !w.handedOutOnce {
		w.handedOutOnce = true
		runtime.Gosched()
	}
	go w.await(dv)
}

// takeBack takes back a delivery started by takeReady (or an ack's
// goroutine) that was never handed out, because the assignment ended
// first. Its record stays unfinished.
func (w *Worker) takeBack(dv *delivery) {
	dv.cancel()
	w.observe(dv.obsState, OutcomeAbandoned, nil)
	w.tokensHeld.Add(-1)
	w.pool.release()
	w.mu.Lock()
	w.inFlight--
	w.mu.Unlock()
	w.wakeRun()
}
