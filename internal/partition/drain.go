package partition

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// drain ends the assignment: nothing more is handed out, acks of the
// messages handed out are awaited up to DrainTimeout with their contexts
// alive, the final completed prefix is marked (and committed when commits
// are manual), the tracker is revoked so that later acks change nothing,
// and only then are the contexts of messages still unanswered cancelled.
// Cancelling first would turn work that could still finish into failures
// (and, behind a plain dead-letter middleware, into dead letters).
func (w *Worker) drain(reason string) {
	w.cancel() // the assignment is ending; message contexts live on
	if w.next != nil {
		w.takeBack(w.next)
		w.next = nil
	}
	// Stop the acks' goroutines from handing out more: the cancelled
	// context lets any that is sending give its record back, and once
	// handOutGate is ours none is left.
	w.handOutGate.Lock()
	w.mu.Lock()
	w.handOutStopped = true
	w.ready.clear()
	w.mu.Unlock()
	w.handOutGate.Unlock()
	w.fetched.clear()
	if w.fetchPaused {
		// Sarama keeps a partition paused across reassignment: a later
		// owner of this partition in this member must find it fetching.
		w.pauser.Resume(map[string][]int32{w.topic: {w.partition}})
		w.fetchPaused = false
	}

	// Waiting for acks serves the final commit, or without a consumer
	// group the position the next connection resumes at; and a handler
	// that finishes meanwhile does so with its context alive rather than
	// failing (and, behind a plain dead-letter middleware, being
	// dead-lettered) because the assignment ended.
	deadline := time.NewTimer(w.cfg.DrainTimeout)
	defer deadline.Stop()
	timedOut := false
	for !timedOut {
		w.mu.Lock()
		n := w.inFlight
		w.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-w.wakeups:
		case <-deadline.C:
			timedOut = true
		}
	}
	w.markIfAdvanced(true)

	w.mu.Lock()
	left := w.inFlight
	stats := w.tracker.Stats()
	w.tracker.Revoke()
	w.gate.Drain(nil)
	w.ready.clear()
	w.mu.Unlock()
	// Give up: the waiters cancel the contexts of messages still
	// unanswered. Waiting for them means Close and a revocation return
	// with every message context of the assignment ended.
	close(w.abandoned)
	w.awaiting.Wait()

	if w.marker != nil {
		// Sarama discards what is marked but not committed when a
		// partition is revoked: commit the final prefix now.
		w.marker.Commit()
	}
	fields := w.logFields.Add(watermill.LogFields{
		"reason":      reason,
		"safe_offset": stats.SafeOffset,
		"retained":    stats.Retained,
		"abandoned":   left,
	})
	if timedOut {
		w.cfg.Logger.Info("Partition drain timed out; unacked records are left to the next owner", fields)
	} else {
		w.cfg.Logger.Debug("Partition drained", fields)
	}
}
