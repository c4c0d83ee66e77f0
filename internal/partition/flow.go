package partition

import (
	"time"
)

// canAccept reports whether run may take another record from the claim.
func (w *Worker) canAccept() bool {
	if w.stuck != nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// paused: the completed tail nears its budget (PauseAtTailUsage).
	return !w.paused && w.ready.len() < w.readyAhead() && w.roomLocked()
}

// Fetch flow control. The claim is always read (see run), so records the
// worker cannot take yet pile up in its fetched queue, and fetching is
// paused to bound it. Fetching resumes while the queue still holds
// resumeLead of records at the rate they are being taken, and pauses at
// twice that.
//
// Sarama, finding every partition of a broker paused, naps for 100 ms and
// looks again, so a resumed partition waits for the rest of a nap, 0-100 ms
// (50 on average), before its next fetch. A lead of 150 ms never ran dry,
// but every record of the lead is held in memory on top of the fetch
// response that arrives next: at zero work (8 partitions, 20k records/s
// each) 150 ms held about 6 MB more heap than 75 ms, while 75 ms cost no
// throughput measurable beside watermill-kafka in the same bench runs. At
// 75 ms a quarter of the resumes can wait past the lead, on average 12 ms,
// once per pause cycle (a fetch response, 0.4 s of records there).
const (
	minResumeBelow = 64     // records; also the least that pauses fetching
	maxResumeBelow = 32_768 // records; bounds the queue at fast rates
	resumeLead     = 75 * time.Millisecond
	rateWindow     = 50 * time.Millisecond
)

// fetchControl pauses fetching while records wait unaccepted, and resumes
// it once few are left. The fetched queue is bounded by twice the resume
// threshold plus what the client had fetched before the pause took effect.
func (w *Worker) fetchControl() {
	if w.pauser == nil || (!w.fetchPaused && w.fetched.len() < 2*minResumeBelow) {
		return
	}
	below := w.resumeBelow()
	switch {
	case !w.fetchPaused && w.fetched.len() >= 2*below:
		w.pauser.Pause(map[string][]int32{w.topic: {w.partition}})
		w.fetchPaused = true
	case w.fetchPaused && w.fetched.len() <= below:
		w.pauser.Resume(map[string][]int32{w.topic: {w.partition}})
		w.fetchPaused = false
	}
}

// resumeBelow returns how many fetched records last resumeLead at the rate
// records have been taken lately, within [minResumeBelow, maxResumeBelow].
func (w *Worker) resumeBelow() int {
	now := time.Now()
	if w.rateFrom.IsZero() {
		w.rateFrom, w.rateCount = now, 0
	} else if d := now.Sub(w.rateFrom); d >= rateWindow {
		inst := float64(w.rateCount) / d.Seconds()
		if w.takeRate == 0 {
			w.takeRate = inst
		} else {
			w.takeRate = (w.takeRate + inst) / 2
		}
		w.rateFrom, w.rateCount = now, 0
	}
	n := int(w.takeRate * resumeLead.Seconds())
	return min(max(n, minResumeBelow), maxResumeBelow)
}

// roomLocked reports whether another record may be taken: the tracker has
// room and the ordering mode's read-ahead is not used up. Callers hold mu.
func (w *Worker) roomLocked() bool {
	return w.tracker.Retained() < w.tracker.Capacity() && w.readAheadLeft()
}

// partitionReadAhead bounds the records taken ahead in ByPartition
// mode, and of key-less records in key mode. There, every record waits for
// the one before it, so reading further ahead adds no concurrency, only
// memory; in key mode a deep read-ahead is what lets other keys pass a busy
// one.
const partitionReadAhead = 16

// readAheadLeft reports whether the ordering mode lets another record be
// taken. Callers hold mu.
func (w *Worker) readAheadLeft() bool {
	switch w.cfg.Ordering {
	case ByPartition:
		return w.gate.Waiting() < partitionReadAhead
	case ByKey:
		// Key-less records wait in one lane, as in partition mode. While
		// they are nearly all the partition holds (a stream without keys),
		// reading further ahead adds only memory; once other records are
		// held, it is what lets keyed ones pass a slow key-less one.
		lane := w.gate.WaitingFor(noKeyLane)
		return lane < partitionReadAhead || w.tracker.Retained()-lane >= partitionReadAhead
	}
	return true
}
