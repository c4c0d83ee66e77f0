package consume

// The leader-epoch check while a partition is consumed (see epoch_check.go
// for the check of a session's start).
//
// While a partition is consumed, the epoch its marks carry is the one its
// epochWatch validated: a newer epoch in the client's metadata is checked
// the same way first, against what the claim took from the log (the
// marks held there until the answer), and a truncation found holds the
// marks at the divergence point and ends the session (see epochWatch). This holds in both modes: in transactional
// mode the positions a transaction commits are those marks, and the one
// held at the divergence point is committed though it covers less than
// the last transaction's (see txnMarker.diverge).
//
// Either way the epoch committed is a metadata epoch, not that of the last
// record's batch: Sarama drops batch epochs. Every record below the offset
// was fetched before, from a leader whose epoch the metadata named then,
// and metadata epochs only grow, so the epoch committed is at least that
// leader's, unless it was read before the fetch: then it may be lower,
// which can only make the check see a divergence that is not there, and
// the records since that epoch's end are handled again. From the record's
// own epoch up to its fetch leader's, any epoch answers alike (Kafka's log
// matching: such an epoch ends, in a log that holds the record, past it).
// What no check here can see is a record of the old leader that reaches
// the claim after the new epoch was validated (fetched before the
// election, still in Sarama's buffers). Sarama's consumer does not
// see these either (it sends no LastFetchedEpoch and reads no diverging
// epoch).

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// epochWatchEvery is how often a claim's watch reads the partition's
// leader epoch from the client's metadata (cached: no request). Sarama
// fetches from a new leader at the earliest partitionConsumersBatchTimeout
// (100 ms) after its metadata names it, so records the new leader serves
// arrive after the watch saw its epoch, and are not taken for records of
// the old one (see epochWatch).
const epochWatchEvery = 25 * time.Millisecond

// epochRecheckAfter is the wait before a leader-epoch check that could not
// run is tried again.
const epochRecheckAfter = time.Second

// epochWatch guards a claim's marks against a truncation while the
// partition is consumed: an unclean leader election while this member
// fetches from the old leader. The worker marks every position with the
// epoch the watch has validated (epoch), not the metadata's latest: when
// the metadata names a newer epoch, the watch first asks the new leader
// where the validated epoch ends in its log (OffsetForLeaderEpoch). At or
// past everything this claim took from the log and marked, the log holds
// what it read: the new epoch is validated and the marks carry it. Below
// it, the log was truncated there: records this member took (and may have
// completed and marked) at or past that point are gone, and the records a
// new leader wrote at those offsets were never fetched (Sarama's fetch is
// past them). The marks are then held at the divergence point (the
// completed tail cut there) and the assignment ends, which ends the
// session (see checkAddedClaim): the next session starts there. Without
// the watch, the marks carried the new epoch, which the next start's
// check (checkLeaderEpochs) finds consistent: the records at the reused
// offsets were skipped.
//
// The watch wraps the claim's Marker in either mode: the session's (see
// offsetCommitter) or the claim's transactional one (txnMarker), whose
// transactions then commit only marks the watch passed on. A Marker that
// keeps its own account of what the group's commit covers is told of the
// divergence first (see divergenceTaker).
//
// Until the new epoch is validated the marks carry the old one, which is
// never unsafe: a next start's check then finds where the old epoch ends,
// perhaps below the committed offset, and handles the records from there
// again. While the check is under way, the marks passed on are also held
// at what the claim had taken when the new epoch was seen (hold): records
// past it came from the new leader, and a position covering them,
// committed before the answer comes, is passed again once the answer
// names a divergence below it: in transactional mode their outputs would
// be committed twice. A check that cannot run lets the marks through as
// they are until it is tried again (they carry the old epoch, which a
// next start checks), but in transactional mode, where a position passed
// commits outputs, the hold stays until an answer comes. One that can
// never run (see epochAnswer.final), or whose answer knows no end for the
// epoch, is not tried again: the new epoch is trusted, as a start trusts
// a commit it cannot check.
//
// A claim whose start could not check its commit (see newEpochWatch)
// checks the commit's epoch the same way, with the marks held at what the
// commit covers: a divergence below it, even below the claim's start,
// holds the marks there and ends the assignment. What the watch
// cannot see are records of the old leader that arrive after it
// validated the new epoch (fetched before the election,
// still in Sarama's buffers): Sarama drops the batches' leader epochs.
type epochWatch struct {
	h         *member
	marker    partition.Marker // the claim's (see commits.claim)
	topic     string
	partition int32
	budget    int

	validated atomic.Int32

	mu       sync.Mutex
	diverged int64 // where the log diverged; -1: it did not
	// checking is, while a new epoch is checked, what the claim held when
	// it was seen: marks are held there until the answer; -1: no check
	// under way. clamped: a mark was held since it was set.
	checking int64
	clamped  bool
	// offset, meta: the last position marked, as the worker marked it;
	// until the first mark, the commit the claim starts from (-1: none).
	offset int64
	meta   string

	// unchecked: the validated epoch is the commit's, which the start
	// could not check, and a check of the metadata's is under way (see
	// newEpochWatch). Read and written by run only.
	unchecked bool

	// found is where the engine's client found the log diverged (see
	// diverged); -1: it did not. foundSig wakes run.
	found    int64
	foundSig chan struct{}

	stop chan struct{}
	wg   sync.WaitGroup
}

// newEpochWatch reads the partition's epoch at once. The epoch the claim
// starts with is validated: the session's start was checked against the
// log (checkLeaderEpochs), and the claim fetches from the leader the
// metadata names. When the metadata names no leader (the partition is
// offline: an election is under way), the epoch of the commit the claim
// starts from (committed, offset -1 when there is none) is, so that the
// new leader's epoch is checked once it is known.
//
// So is it when the start's check of that commit could not run
// (unchecked: see checkLeaderEpochs) and the metadata names a newer epoch:
// the election happened while no member consumed, and the commit may lie
// past where its epoch ends in the new leader's log. The watch then checks
// the commit's epoch as it checks a new one, against what the commit
// covers (its offset and completed tail), not against what the claim
// took: every record the claim takes comes from the new leader. The marks
// are held there until the answer (see run).
func newEpochWatch(h *member, marker partition.Marker, topic string, p int32, committed kclient.CommittedOffset, unchecked bool) *epochWatch {
	x := &epochWatch{h: h, marker: marker, topic: topic, partition: p, budget: h.sub.cfg.TailMetadataBudget,
		diverged: -1, checking: -1, offset: committed.Offset, meta: committed.Metadata,
		found: -1, foundSig: make(chan struct{}, 1), stop: make(chan struct{})}
	x.validated.Store(frontier.NoLeaderEpoch)
	ce, haveEpoch := frontier.LeaderEpochOf(committed.Metadata)
	haveEpoch = haveEpoch && committed.Offset >= 0
	e, err := h.reads.LeaderEpoch(p)
	switch {
	case unchecked && haveEpoch && (err != nil || e > ce):
		x.validated.Store(ce)
		x.unchecked, x.checking = true, positionEnd(committed.Offset, committed.Metadata)
	case err == nil && e >= 0:
		x.validated.Store(e)
	case haveEpoch:
		x.validated.Store(ce)
	}
	return x
}

// epoch is the worker's Assignment.LeaderEpoch: the last epoch validated.
func (x *epochWatch) epoch() int32 { return x.validated.Load() }

// start watches the epoch of w's partition until close.
func (x *epochWatch) start(ctx context.Context, w *partition.Worker) {
	x.wg.Go(func() { x.run(ctx, w) })
}

// close stops the watch and waits for it.
func (x *epochWatch) close() {
	close(x.stop)
	x.wg.Wait()
}

func (x *epochWatch) run(ctx context.Context, w *partition.Worker) {
	t := time.NewTicker(epochWatchEvery)
	defer t.Stop()
	var retryAt time.Time
	hold := int64(-1) // what the claim held when the new epoch was seen; -1: no check pending
	for {
		select {
		case <-x.stop:
			return
		case <-ctx.Done():
			return
		case <-x.foundSig:
			x.mu.Lock()
			found := x.found
			x.mu.Unlock()
			// The claim took (or holds) records past it that the log
			// no longer has: even when none was marked past it, those
			// it holds must not be handed out.
			x.truncate(w, x.notBelowLogStart(found), x.h.sub.logFields.Add(watermill.LogFields{
				"kafka_topic": x.topic, "kafka_partition": x.partition, "leader_epoch": x.validated.Load(),
				"diverged_at": found, "found_by": "the client's fetch"}))
			return
		case <-t.C:
		}
		if time.Now().Before(retryAt) {
			continue
		}
		e, err := x.h.reads.LeaderEpoch(x.partition)
		if err != nil {
			// No leader in the metadata: the read refreshed it (and
			// waited for it), which is not to be done every tick.
			retryAt = time.Now().Add(epochRecheckAfter)
			continue
		}
		v := x.validated.Load()
		if e <= v {
			if x.unchecked {
				// The commit's own epoch leads (the metadata named no
				// leader): its log is the one the commit was made in.
				x.unchecked = false
				x.release(frontier.NoLeaderEpoch)
			}
			continue
		}
		if v < 0 {
			x.validated.Store(e) // nothing was marked with an epoch to check
			continue
		}
		// Marks are held at what the claim holds now until the answer.
		held := x.holdMarks(w)
		if hold < 0 {
			// Read after the epoch: every record the old leader served
			// before the metadata named the new one is counted. Kept for
			// a check tried again: what the claim took since then came
			// from the new leader.
			hold = held
		}
		cctx, cancel := context.WithTimeout(ctx, epochCheckTimeout)
		a, ok := x.h.epochs.offsetForLeaderEpoch(cctx, x.topic, map[int32]int32{x.partition: v})[x.partition]
		cancel()
		if !ok {
			a = epochAnswer{endOffset: -1, err: errNoEpochAnswer}
		}
		fields := x.h.sub.logFields.Add(watermill.LogFields{
			"kafka_topic": x.topic, "kafka_partition": x.partition, "leader_epoch": v, "new_leader_epoch": e,
		})
		switch {
		case a.err == nil && a.endOffset < 0, a.err != nil && a.final:
			// Trying again cannot cure it (the leader knows no end for
			// the epoch, or the check can never run): the new epoch is
			// trusted, as a start trusts a commit it cannot check.
			if a.err != nil {
				fields["err"] = a.err.Error()
			}
			x.h.sub.logger.Info("Cannot check the partition's log against its last leader epoch; trusting the new epoch", fields)
			x.validated.Store(e)
			hold, x.unchecked = -1, false
			x.release(frontier.NoLeaderEpoch)
		case a.err != nil:
			fields["err"] = a.err.Error()
			retryAt = time.Now().Add(epochRecheckAfter)
			if _, exact := x.marker.(divergenceTaker); exact {
				// Transactional: a position past the hold, committed
				// with its outputs, would be handled (and its outputs
				// committed) again if the answer, once it comes, names
				// a divergence below it.
				x.h.sub.logger.Info("Cannot check the partition's log against its last leader epoch; positions are held where the new epoch was seen until it is checked", fields)
				continue
			}
			x.h.sub.logger.Info("Cannot check the partition's log against its last leader epoch; marks carry that epoch until it is checked", fields)
			x.release(frontier.NoLeaderEpoch)
		default:
			at := a.endOffset
			if at < hold {
				// Records below the log start are gone, and a position
				// there would fall back to Offsets.Initial.
				at = x.notBelowLogStart(at)
			}
			if at < hold {
				x.truncate(w, at, fields.Add(watermill.LogFields{"epoch_end_offset": a.endOffset, "received_or_marked": hold, "held_at": at}))
				return
			}
			x.validated.Store(e)
			hold, x.unchecked = -1, false
			x.release(e)
		}
	}
}

// foundDivergence tells the watch that the engine's client found the partition's
// log diverged at at (franz-go's own leader-epoch check moved its fetch
// back there): run holds the marks there and ends the assignment, as for
// a truncation it finds itself.
func (x *epochWatch) foundDivergence(at int64) {
	x.mu.Lock()
	if x.found < 0 || at < x.found {
		x.found = at
	}
	x.mu.Unlock()
	select {
	case x.foundSig <- struct{}{}:
	default:
	}
}

// holdMarks holds the marks passed on, while a new epoch is checked, at
// what the claim holds now (see release), and returns it: the offset after
// everything the claim took from the log or marked (its records, its
// marked position, or the commit it started from until it marks, and the
// completed tail with it). It is read under mu,
// so that no mark past it is passed on before the hold, and no mark
// passed on before lies past it.
func (x *epochWatch) holdMarks(w *partition.Worker) int64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.checking >= 0 {
		return x.checking // still held from a check tried before
	}
	hold := max(w.Received(), positionEnd(x.offset, x.meta))
	x.checking, x.clamped = hold, false
	return hold
}

// release ends the hold of a check that validated the new epoch or could
// not run: the worker's last mark, if it was held, is passed on as it was
// made. Validated is the epoch the check validated (NoLeaderEpoch: none):
// a last mark made with an older one is passed on again with it. It may
// cover records the new leader wrote past where the older epoch ends (the
// claim took them during the check), and it may stay the group's commit
// (no record completes after it): with the older epoch, the next start's
// check would take those records for a truncation and handle them again.
func (x *epochWatch) release(validated int32) {
	x.mu.Lock()
	defer x.mu.Unlock()
	clamped := x.clamped
	x.checking, x.clamped = -1, false
	if x.diverged >= 0 || x.offset < 0 {
		return
	}
	if e, ok := frontier.LeaderEpochOf(x.meta); ok && e < validated {
		x.meta, clamped = withLeaderEpoch(x.offset, x.meta, validated, x.budget), true
	}
	if clamped {
		x.marker.MarkOffset(x.topic, x.partition, x.offset, x.meta)
		x.marker.ResetOffset(x.topic, x.partition, x.offset, x.meta) // a tail changed at the same offset
	}
}

// divergenceTaker is a Marker that keeps its own account of what the
// group's commit covers and commits nothing that covers less
// (txnMarker): diverge tells it that the log diverged at at, so that the
// position held there is committed.
type divergenceTaker interface {
	diverge(at int64)
}

// notBelowLogStart is at, or the partition's log start when at is below
// it (at when the log start cannot be read).
func (x *epochWatch) notBelowLogStart(at int64) int64 {
	if first, err := x.h.reads.LogStart(x.partition); err == nil && first > at {
		return first
	}
	return at
}

// truncate holds the marks at the divergence point at, and ends the
// assignment: its drain commits that position (see epochWatch). At may lie
// below the claim's start (the log was truncated under the commit it
// started from): the position is moved back there all the same
// (ResetOffset), and a transactional marker takes it though it covers
// less than the group's commit (see divergenceTaker).
func (x *epochWatch) truncate(w *partition.Worker, at int64, fields watermill.LogFields) {
	x.mu.Lock()
	x.diverged, x.checking = at, -1
	if d, ok := x.marker.(divergenceTaker); ok {
		d.diverge(at)
	}
	if x.offset >= 0 {
		off, meta := x.clampLocked(x.offset, x.meta)
		x.marker.MarkOffset(x.topic, x.partition, off, meta)
		x.marker.ResetOffset(x.topic, x.partition, off, meta) // back below Sarama's offset
	}
	x.mu.Unlock()
	w.CountLogTruncation()
	x.h.sub.logger.Error("The partition's log was truncated while it was consumed (unclean leader election?); "+
		"ending the session so that the records from where it diverged are handled again", errLogTruncated, fields)
	w.End()
}

// holdingLocked reports whether marks are held: at the divergence
// point, or while a new epoch is checked. Callers hold mu.
func (x *epochWatch) holdingLocked() bool { return x.diverged >= 0 || x.checking >= 0 }

// clampLocked is a position held at the divergence point, or while a new
// epoch is checked at what the claim held when it was seen: the offset at
// most there, its tail cut there. Callers hold mu.
func (x *epochWatch) clampLocked(offset int64, meta string) (int64, string) {
	at := x.diverged
	if at < 0 {
		at = x.checking
	}
	if offset < 0 || at < 0 {
		return offset, meta
	}
	if offset <= at {
		meta, _ = cutTail(offset, meta, at, x.budget)
		return offset, meta
	}
	epoch, ok := frontier.LeaderEpochOf(meta)
	if !ok {
		epoch = frontier.NoLeaderEpoch
	}
	meta, _, err := frontier.EncodeTailEpoch(at, nil, x.budget, epoch)
	if err != nil {
		meta = ""
	}
	return at, meta
}

// MarkOffset passes the worker's mark on, held at the divergence point
// once there is one, and while a new epoch is checked.
func (x *epochWatch) MarkOffset(topic string, p int32, offset int64, meta string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.offset, x.meta = offset, meta
	if !x.holdingLocked() {
		x.marker.MarkOffset(topic, p, offset, meta)
		return
	}
	offset, meta = x.clampLockedNoting(offset, meta)
	x.marker.MarkOffset(topic, p, offset, meta)
	x.marker.ResetOffset(topic, p, offset, meta)
}

// ResetOffset is MarkOffset for the worker's resets.
func (x *epochWatch) ResetOffset(topic string, p int32, offset int64, meta string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.offset, x.meta = offset, meta
	if x.holdingLocked() {
		offset, meta = x.clampLockedNoting(offset, meta)
		x.marker.MarkOffset(topic, p, offset, meta)
	}
	x.marker.ResetOffset(topic, p, offset, meta)
}

// clampLockedNoting is clampLocked, noting a mark held while a new epoch
// is checked (see release). Callers hold mu.
func (x *epochWatch) clampLockedNoting(offset int64, meta string) (int64, string) {
	off, m := x.clampLocked(offset, meta)
	if off != offset || m != meta {
		x.clamped = true
	}
	return off, m
}

// Commit commits through the claim's Marker.
func (x *epochWatch) Commit() { x.marker.Commit() }

var _ partition.Restarter = (*epochWatch)(nil)

// Restart passes a restart on to the claim's Marker when it takes one
// (see partition.Restarter).
func (x *epochWatch) Restart(p int32, start int64, tail frontier.Tail) {
	if r, ok := x.marker.(partition.Restarter); ok {
		r.Restart(p, start, tail)
	}
}

// position is the worker's last marked position, held at the divergence
// point once there is one (and while a new epoch is checked): what the
// claim's final commit must hold.
func (x *epochWatch) position(w *partition.Worker) (int64, string) {
	offset, meta := w.MarkedPosition()
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.clampLocked(offset, meta)
}

// markedPosition is w's last marked position as the session holds it
// (see epochWatch.position); x may be nil.
func markedPosition(w *partition.Worker, x *epochWatch) (int64, string) {
	if x == nil {
		return w.MarkedPosition()
	}
	return x.position(w)
}
