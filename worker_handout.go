package safeack

import (
	"context"
	"time"
)

// maxReadyAhead bounds the records kept ready to hand out per partition. A
// few dozen let the acks' goroutines refill the handlers while run takes the
// next batch from the claim; more would only unmarshal records early.
const maxReadyAhead = 32

// readyAhead is how many ready records run keeps queued: the partition's
// share of MaxInFlight, at most maxReadyAhead. More than the share could only
// be handed out with tokens of other partitions, so it would unmarshal
// records early and, measured, slows the others.
func (w *partitionWorker) readyAhead() int {
	return min(maxReadyAhead, w.tokenShare())
}

// tokenShare is the partition's fair share of MaxInFlight among the
// subscription's running partitions.
func (w *partitionWorker) tokenShare() int {
	return max(1, w.sub.cfg.MaxInFlight/max(1, int(w.sub.partitions.Load())))
}

// wantsToken reports whether run should wait for an in-flight token: a
// record is ready and the partition holds less than its share of the
// tokens. At its share, the partition's own acks pass their tokens on to
// its ready records (see completeAndContinue), so run waiting as well would
// only take turns with them; below it, waiting queues the partition for the
// next token any partition frees.
func (w *partitionWorker) wantsToken() bool {
	return int(w.holding.Load()) < w.tokenShare() && w.readyLen() > 0
}

func (w *partitionWorker) readyLen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready.len()
}

// tryHandOut hands out the next ready record when a token is free and a
// receiver waits, without blocking. It reports whether it did.
func (w *partitionWorker) tryHandOut() bool {
	if w.next == nil {
		if w.readyLen() == 0 {
			return false
		}
		select {
		case w.sub.tokens <- struct{}{}:
		default:
			return false
		}
		if w.next = w.takeReady(); w.next == nil {
			w.sub.releaseToken()
			return false
		}
	}
	select {
	case w.sub.output <- w.next.wm:
		w.sent()
		return true
	default:
		return false
	}
}

// takeReady pops the next ready record for a caller holding a token and
// gives it a fresh delivery context. It returns nil when none is ready or
// the assignment is ending. The record counts in flight from here.
func (w *partitionWorker) takeReady() *record {
	w.mu.Lock()
	if w.handedDone || w.ready.len() == 0 {
		w.mu.Unlock()
		return nil
	}
	r := w.ready.pop()
	w.inFlight++
	w.mu.Unlock()
	w.holding.Add(1)
	w.startDelivery(r)
	return r
}

// startDelivery gives the record's current delivery its context and stamps
// when it is handed out. Contexts are made only here, once a record starts,
// so records waiting for their key or in the ready queue cost none. The
// stamp is written before the send, so the handler reads it safely.
func (w *partitionWorker) startDelivery(r *record) {
	ctx := context.WithValue(w.parentCtx, recordCtxKey{}, r)
	if w.txn != nil {
		ctx = w.txn.newDelivery(ctx, r.wm)
	}
	ctx, cancel := context.WithCancel(ctx)
	r.wm.SetContext(ctx)
	r.cancel = cancel
	r.deliveredAt = time.Now()
}

// sent is called by run once the consumer took w.next.
func (w *partitionWorker) sent() {
	r := w.next
	w.next = nil
	w.awaiting.Add(1) // only run adds, and run is the one that waits
	go w.await(r)
}

// unsend takes back a record popped by takeReady that was never handed
// out, because the assignment ended first. It stays unfinished.
func (w *partitionWorker) unsend(r *record) {
	r.cancel()
	w.holding.Add(-1)
	w.sub.releaseToken()
	w.mu.Lock()
	w.inFlight--
	w.mu.Unlock()
	w.poke()
}
