package consume

// One claim of a group session, from its admission (after the session's
// pinned starts) through where it starts (Setup's preparation, or a commit
// read on its own) to its partition worker's run and the hand-over of its
// last position.

import (
	"maps"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// admitClaim waits until the session's pinned starts are committed:
// nothing is taken from a claim, handed out or shown in Stats before;
// Sarama made the claim (resolving its start, starting its fetch)
// meanwhile. It reports false when the session ended or the subscription
// stops first; otherwise the claim is counted until claimReturned.
func (h *member) admitClaim(sess groupSession) bool {
	h.mu.Lock()
	pinned := h.pinned
	h.mu.Unlock()
	<-pinned
	if sess.Context().Err() != nil || h.sub.stopping(h.ctx) {
		return false
	}
	h.claims.Add(1)
	return true
}

// claimReturned uncounts an admitted claim. It reports whether it was the
// last while the subscription stops: the fetches are not needed any more.
func (h *member) claimReturned() (lastWhileStopping bool) {
	return h.claims.Add(-1) == 0 && h.sub.halt.isStopping()
}

// claimStart is what a session's Setup prepared for its first claim of a
// partition, taken whole by that claim (takeClaimStart): a claim that
// comes later in the session, added by a cooperative rebalance or coming
// back, reads its commit on its own.
type claimStart struct {
	// committed is the group's commit Setup read; fromSetup: there was
	// one (a partition without a commit, or one Setup could not read,
	// has none).
	committed kclient.CommittedOffset
	fromSetup bool
	// truncated: the leader-epoch check found the partition's log
	// truncated under the commit (this session's Setup, or an added
	// claim's check that ended the last session; see checkAddedClaim).
	// unchecked: Setup could not check the commit's epoch yet (see
	// checkLeaderEpochs).
	truncated, unchecked bool
	// first is the partition's early fetch (see subscription.fetchFirstRecords).
	first *firstFetch
}

// claimStarts gathers what Setup prepared for the claimed partitions:
// committed (nil when it could not be read), the leader-epoch check's
// truncated and unchecked partitions, the truncations found before that
// no claim counted yet (truncatedBefore), and the early fetches.
func claimStarts(claimed []int32, committed map[int32]kclient.CommittedOffset, truncated, unchecked, truncatedBefore map[int32]bool,
	first map[int32]*firstFetch,
) map[int32]claimStart {
	starts := make(map[int32]claimStart, len(claimed))
	for _, p := range claimed {
		c, ok := committed[p]
		starts[p] = claimStart{
			committed: c, fromSetup: ok,
			truncated: truncated[p] || truncatedBefore[p],
			unchecked: unchecked[p],
			first:     first[p],
		}
	}
	return starts
}

// takeClaimStart returns what Setup prepared for the claim of partition,
// for the session's first claim of it only.
func (h *member) takeClaimStart(partition int32) claimStart {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.starts[partition]
	delete(h.starts, partition)
	if h.truncatedAdded[partition] {
		st.truncated = true
		delete(h.truncatedAdded, partition)
	}
	return st
}

// truncationsNotCountedLocked lists the partitions whose truncation no
// claim counted yet: found by an added claim's check, or by a Setup whose
// claim of the partition did not run. The next session's claim counts
// them. Callers hold h.mu.
func (h *member) truncationsNotCountedLocked() map[int32]bool {
	out := maps.Clone(h.truncatedAdded)
	for p, st := range h.starts {
		if st.truncated {
			out = withPartition(out, p)
		}
	}
	return out
}

// committedOffset returns the commit the claim of partition starts from:
// the one Setup read (st.fromSetup), or, for a claim that a cooperative
// rebalance added to a running session without a new Setup (or that comes
// back later in the session, for the commit and completed tail its last
// owner left since), one read now. A failed read is logged and returned.
func (h *member) committedOffset(partition int32, st claimStart) (c kclient.CommittedOffset, ok bool, err error) {
	if st.fromSetup {
		return st.committed, true, nil
	}
	fetched, err := h.reads.Committed([]int32{partition})
	if err != nil {
		h.sub.logger.Error("Cannot read committed metadata; the completed tail is not skipped", err,
			h.sub.logFields.Add(watermill.LogFields{"kafka_partition": partition}))
		return kclient.CommittedOffset{}, false, err
	}
	c, ok = fetched[partition]
	return c, ok, nil
}

// checkAddedClaim runs the leader-epoch check (see checkLeaderEpochs) for
// a claim that came without Setup: cooperative rebalancing adds claims to
// a running session. Its fetch started at the commit already, so a
// truncation found cannot move it back: the divergence point is committed
// instead (read back until the coordinator holds it) and it reports ended:
// the claim returns, which ends the session, and the next one starts there.
// unchecked: the check could not run yet (see newEpochWatch).
func (h *member) checkAddedClaim(sess groupSession, partition int32, c kclient.CommittedOffset) (ended, unchecked bool) {
	marks := map[int32]kclient.CommittedOffset{partition: c}
	truncated, notChecked := h.checkLeaderEpochs(sess, marks)
	if len(truncated) == 0 {
		return false, notChecked[partition]
	}
	h.mu.Lock()
	h.truncatedAdded = withPartition(h.truncatedAdded, partition)
	h.mu.Unlock()
	ctx, cancel := h.sub.halt.within(h.sub.cfg.finalCommitWait())
	defer cancel()
	h.offsets.confirm(ctx, sess, marks)
	h.sub.logger.Info("Ending the session so that the truncated partition starts again where its log diverged",
		h.sub.logFields.Add(watermill.LogFields{"kafka_partition": partition, "start": marks[partition].Offset}))
	return true, false
}

// origin is where a claim starts from: what Setup prepared for it, and the
// group's commit (have false: none).
type origin struct {
	claimStart
	commit     kclient.CommittedOffset
	haveCommit bool
}

// claimOrigin reads where the claim of partition starts from (see
// committedOffset) and checks the leader epoch of a commit Setup did not
// check (see checkAddedClaim). run false: the claim returns at once, with
// err (nil, or the error that ends the session, whose next Setup reads the
// commits again).
func (h *member) claimOrigin(sess groupSession, partition int32) (o origin, run bool, err error) {
	o.claimStart = h.takeClaimStart(partition)
	o.commit, o.haveCommit, err = h.committedOffset(partition, o.claimStart)
	if err != nil {
		if err := h.commits.withoutCommitted("the committed offset of a claim", err); err != nil {
			return o, false, err
		}
	}
	if o.haveCommit && !o.fromSetup {
		var ended bool
		if ended, o.unchecked = h.checkAddedClaim(sess, partition, o.commit); ended {
			return o, false, nil
		}
	}
	return o, true, nil
}

// feed is the records a claim's worker takes and where they start: the
// claim's own, or those below a pinned start first (see backfill).
type feed struct {
	messages <-chan *sarama.ConsumerMessage
	start    partition.Start
	backfill bool
	done     chan struct{} // closed by close: the backfill stops
	// watching, when not nil, is given the claim's validated leader epoch
	// (see epochWatch.epoch) before the worker runs: an engine whose
	// records carry their leader epoch holds those of a newer epoch until
	// the watch checked it.
	watching func(validated func() int32)
	// diverging, when not nil, is given once the worker runs the way to
	// tell the claim that the engine found the partition's log diverged
	// at an offset (see member.diverged): an engine whose client checks
	// leader epochs on its own and moves its fetch back on a truncation.
	diverging func(diverged func(at int64))
}

func (f feed) close() {
	if f.done != nil {
		close(f.done)
	}
}

// runClaim runs the claim's partition worker until the claim ends, its
// completed positions going to the session's committer.
func (h *member) runClaim(sess groupSession, claim groupClaim, o origin, f feed) error {
	// Where completed offsets go: the session's marks, or the transaction.
	commits := h.commits.claim(sess, claim.Partition())
	defer commits.done()
	a := partition.Assignment{
		Topic:          claim.Topic(),
		Partition:      claim.Partition(),
		Start:          f.start,
		Marker:         commits.marker,
		Deliveries:     commits.deliveries,
		Pauser:         h.pauser,
		HighWaterMark:  claim.HighWaterMarkOffset,
		RequestCommit:  commits.requestCommit,
		StartCommitted: commits.startCommitted,
		// A backfilled claim's start is resolved here, without a commit:
		// the worker commits it before anything is handed out, as Setup
		// does for the session's first claims (pinStarts).
		PinStart: f.backfill && f.start.Resolved,
	}
	if ff := o.first; ff != nil && !f.backfill && f.start.Resolved && ff.from == f.start.Offset {
		a.FirstRecords = ff.records
	}
	var watch *epochWatch // the marks' epochs are checked while consuming (see epochWatch)
	if !h.sub.cfg.DisableCompletedTail {
		from := kclient.CommittedOffset{Offset: -1} // no commit: the claim's start is resolved later
		if o.haveCommit {
			from = o.commit
		}
		watch = newEpochWatch(h, a.Marker, claim.Topic(), claim.Partition(), from, o.unchecked)
		a.Marker, a.LeaderEpoch = watch, watch.epoch
		if f.watching != nil {
			f.watching(watch.epoch)
		}
	}
	w, err := h.sub.newWorker(sess.Context(), a)
	if err != nil {
		return err
	}
	commits.bind(w, o.commit, o.haveCommit)
	if o.truncated {
		w.CountLogTruncation()
	}
	if o.haveCommit {
		w.StartFromCommit(o.commit.Offset, o.commit.Metadata)
	}
	if watch != nil {
		watch.start(sess.Context(), w)
		defer watch.close()
	}
	if f.diverging != nil {
		f.diverging(func(at int64) { h.diverged(w, watch, at) })
	}
	h.workers.Add(w)
	h.sub.leaders.started(w)
	h.sub.host.Attach(w)
	defer func() {
		h.sub.host.Detach(w)
		h.sub.leaders.ended(w)
		h.workers.Remove(w)
	}()
	w.Run(f.messages, h.sub.host.Closing())
	commits.end(w, watch)
	return nil
}

// diverged ends the claim of w's partition, whose log the engine's client
// found diverged at at: the records the claim took (or holds, not yet
// handed out) from there on are not the log's any more, and the client
// fetches from there again. The epoch watch holds the marks there, as it
// does for a truncation it finds itself (see epochWatch.truncate), so that
// the claim's drain commits no position past the divergence; the claim
// then starts again from the group's commit. Without a watch
// (DisableCompletedTail, which checks no epoch while consuming) the drain
// commits the completed prefix as it is.
func (h *member) diverged(w *partition.Worker, watch *epochWatch, at int64) {
	if watch != nil {
		watch.foundDivergence(at)
		return
	}
	w.CountLogTruncation()
	h.sub.logger.Error("The partition's log was truncated while it was consumed (unclean leader election?); "+
		"its claim starts again from the group's commit", errLogTruncated,
		h.sub.logFields.Add(watermill.LogFields{"kafka_partition": w.Partition(), "diverged_at": at}))
	w.End()
}
