package partition

import (
	"math"
	"time"

	"github.com/safeack/safeack/frontier"
)

// markIfAdvanced hands the completed prefix to Sarama when it changed,
// with the completed tail in the metadata. A tail is encoded when forced: by
// the session's commit loop just before each commit, once per commit
// interval (Sarama commits no more often), or by a drain. Unforced (run's
// call after completions), it marks a prefix with no completed record behind
// it, which needs no encoding, so a partition that keeps up is marked at
// once; a tail it encodes only when PauseAtTailUsage needs to know its size
// (see tailCheckDueLocked). It reports whether it marked, and whether every
// record taken so far is complete.
func (w *Worker) markIfAdvanced(force bool) (marked, allDone bool) {
	if !w.prefixMayMove.Load() {
		return false, false
	}
	tailOn := w.marker != nil && w.cfg.CompletedTail
	w.markMu.Lock()
	defer w.markMu.Unlock()
	w.mu.Lock()
	if tailOn && !force && w.tracker.Blocked() > 0 && !w.tailCheckDueLocked() {
		w.mu.Unlock()
		return false, false // the commit loop encodes the tail
	}
	if !w.prefixMayMove.Swap(false) {
		w.mu.Unlock()
		return false, false // marked by another caller meanwhile
	}
	safe, err := w.tracker.SafeOffset()
	if err != nil {
		w.mu.Unlock()
		return false, false
	}
	allDone = w.tracker.Retained() == 0
	w.accepted.dropBelow(safe) // keeps the log as short as the retained window
	if tailOn {
		w.rangeBuf = w.tracker.AppendCompleted(w.rangeBuf[:0])
		b := w.tracker.TailLenBound()
		w.tailRecheckAt = b + b/8 + 1
	}
	prev := w.marked
	w.marked = max(prev, safe)
	w.mu.Unlock()

	var meta string
	if tailOn {
		meta = w.encodeTail(safe, w.leaderEpochNow())
	}
	switch {
	case w.marker == nil:
	case safe > prev:
		w.marker.MarkOffset(w.topic, w.partition, safe, meta)
		marked = true
	case safe == prev && meta != w.lastMeta:
		// MarkOffset ignores a mark at or below Sarama's current offset, so
		// a tail that grew behind an unchanged head is written with
		// ResetOffset, which applies at or below it. It cannot move the
		// offset back: Sarama's offset is the start (a committed, in-range
		// offset, or the one fixStart committed) or an earlier mark, all at
		// most safe.
		w.marker.ResetOffset(w.topic, w.partition, safe, meta)
		marked = true
	}
	w.lastMeta = meta
	return marked, allDone
}

// encodeTail encodes the completed ranges in rangeBuf relative to safe,
// within the metadata budget, with the leader epoch in front (see
// leaderEpochNow), and updates the pause state. An empty tail costs nothing
// and is not counted as an encode. Callers hold markMu.
func (w *Worker) encodeTail(safe int64, epoch int32) string {
	var buf []byte
	cut, encoded := false, len(w.rangeBuf) > 0
	budget := w.cfg.TailBudget
	if encoded {
		var bound int64
		var err error
		buf, bound, err = frontier.AppendTailEpoch(w.tailBuf[:0], safe, w.rangeBuf, budget, epoch)
		if err != nil {
			// The tracker's ranges are valid by construction; if not, commit
			// plain offsets rather than anything doubtful.
			w.cfg.Logger.Error("Cannot encode the completed tail; committing the offset alone", err, w.logFields)
			buf = buf[:0]
		}
		w.tailBuf = buf
		cut = err == nil && bound != math.MaxInt64
	}
	pause := false
	if f := w.cfg.PauseAtTailUsage; f > 0 && encoded {
		pause = cut || float64(len(buf)) >= f*float64(budget)
	}
	w.mu.Lock()
	if encoded {
		w.counters.tailEncodes++
	}
	w.tailBytes, w.tailCut = len(buf), cut
	resumed := w.setPausedLocked(pause)
	w.mu.Unlock()
	if resumed {
		w.wakeRun() // run may take records again
	}
	if !encoded {
		return w.epochOnly(safe, epoch)
	}
	return string(buf)
}

// leaderEpochNow is the leader epoch to commit beside the offset being
// marked: the partition's leader epoch in the client's metadata now, after
// every record below the offset was fetched, so at least the epoch of the
// leader each was fetched from (see Assignment.LeaderEpoch). Unknown now,
// the last one known is kept: it is lower, which can only make the next
// start's check handle records again. Callers hold markMu.
func (w *Worker) leaderEpochNow() int32 {
	if w.leaderEpoch == nil {
		return frontier.NoLeaderEpoch
	}
	if e := w.leaderEpoch(); e >= 0 {
		w.epoch = e
	}
	return w.epoch
}

// epochOnly is the metadata of a mark without a tail: the leader epoch
// alone, built once per epoch. Callers hold markMu.
func (w *Worker) epochOnly(safe int64, epoch int32) string {
	if epoch < 0 {
		return ""
	}
	if epoch != w.epochMetaOf || w.epochMeta == "" {
		meta, _, err := frontier.EncodeTailEpoch(safe, nil, w.cfg.TailBudget, epoch)
		if err != nil {
			return ""
		}
		w.epochMeta, w.epochMetaOf = meta, epoch
	}
	return w.epochMeta
}

// tailCheckDueLocked is PauseAtTailUsage between commits: run asks it after
// completions behind an unfinished head, where the tail is otherwise left to
// the commit loop. The tracker's TailLenBound, O(1), bounds the encoded
// tail. Below the fraction of the budget, the tail is too: nothing to
// encode, and a paused partition resumes at once. At or above it, the tail
// may have reached the fraction, and it is encoded now (which decides the
// pause exactly) when the bound has grown by an eighth since the last
// encoding: a tail that keeps growing is encoded O(log) times, each costing
// O(retained), so the cost per completion stays constant. With
// PauseAtTailUsage zero it costs one comparison. Callers hold markMu and mu.
func (w *Worker) tailCheckDueLocked() bool {
	f := w.cfg.PauseAtTailUsage
	if f == 0 {
		return false
	}
	bound := w.tracker.TailLenBound()
	if float64(bound) < f*float64(w.cfg.TailBudget) {
		w.setPausedLocked(false) // run, the caller, takes records next
		return false
	}
	return bound >= w.tailRecheckAt
}

// setPausedLocked sets the pause state (PauseAtTailUsage) and accounts the
// time paused. It reports whether the partition resumed. Callers hold markMu
// and mu.
func (w *Worker) setPausedLocked(pause bool) (resumed bool) {
	if pause == w.paused {
		return false
	}
	now := time.Now()
	if pause {
		w.pausedAt = now
	} else {
		w.pausedFor += now.Sub(w.pausedAt)
	}
	w.paused = pause
	return !pause
}

// MarkTail marks the completed prefix with the completed tail behind it,
// when either changed since the last mark: the session's commit loop calls
// it just before each commit.
func (w *Worker) MarkTail() { w.markIfAdvanced(true) }

// Marked returns the last offset handed to the Marker: the start, or -1
// until the first record fixes a start Sarama resolved itself.
func (w *Worker) Marked() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.marked
}

// MarkedPosition returns the last position marked: the offset and the
// completed tail's metadata that went with it.
func (w *Worker) MarkedPosition() (offset int64, metadata string) {
	w.markMu.Lock()
	defer w.markMu.Unlock()
	return w.Marked(), w.lastMeta
}

// SetConfirmed records the offset the group coordinator holds as
// committed, for Stats.
func (w *Worker) SetConfirmed(offset int64) {
	w.mu.Lock()
	w.confirmed = offset
	w.mu.Unlock()
}
