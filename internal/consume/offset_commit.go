package consume

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/sentinel"
)

// offsetCommitter is the committer of a subscription that commits offsets
// through the group session: the workers mark their completed prefix (and
// tail) in Sarama's offset manager, a commit loop commits the marks once
// per commit interval (and early for a partition that caught up), and the
// final position of each claim the session ends is committed and read back
// until the coordinator holds it (Sarama reports no refused commit, and
// drops a revoked partition's marks).
type offsetCommitter struct {
	h *groupHandler

	// Per session: set by begin, ended by stopLoop.
	stop chan struct{}
	done chan struct{}
	soon chan struct{} // capacity 1: a partition asks for a commit now

	mu sync.Mutex
	// final is the last position each claim the session ended marked,
	// for finish to confirm; nil outside a session.
	final map[int32]kclient.CommittedOffset
}

var _ committer = (*offsetCommitter)(nil)

// withoutCommitted lets the session go on: without the completed tails
// every record after a committed offset is redelivered, more repeats and
// nothing lost.
func (o *offsetCommitter) withoutCommitted(string, error) error { return nil }

func (o *offsetCommitter) begin(sess sarama.ConsumerGroupSession, _ map[int32]kclient.CommittedOffset) {
	o.mu.Lock()
	o.final = make(map[int32]kclient.CommittedOffset)
	o.mu.Unlock()
	o.stop, o.done = make(chan struct{}), make(chan struct{})
	o.soon = make(chan struct{}, 1)
	go o.commitLoop(sess, o.stop, o.done, o.soon)
}

func (o *offsetCommitter) stopLoop(ctx context.Context) {
	if o.stop == nil {
		return
	}
	close(o.stop)
	// The commit loop ends after its current commit, which waits for the
	// broker (Net.ReadTimeout when it does not answer): not past the
	// final commit's bound.
	waitOr(ctx, o.done)
	o.stop = nil
}

// finish commits the session's final marks and reads them back, committing
// again until the coordinator holds the last mark of every claim the
// session ended (see sessionOffsets.confirm).
func (o *offsetCommitter) finish(ctx context.Context, sess sarama.ConsumerGroupSession) {
	o.mu.Lock()
	final := o.final
	o.final = nil
	o.mu.Unlock()
	o.h.offsets.confirm(ctx, sess, final)
}

func (o *offsetCommitter) claim(sess sarama.ConsumerGroupSession, p int32) claimCommits {
	h := o.h
	return claimCommits{
		marker:        sessionMarker{sess, h},
		requestCommit: o.commitSoon,
		startCommitted: func(offset int64) bool {
			held, err := kclient.FetchCommitted(h.client, h.sub.cfg.ConsumerGroup, h.sub.topic, []int32{p})
			return err == nil && held[p].Offset == offset
		},
		ended: func(offset int64, meta string) { o.ended(sess, p, offset, meta) },
	}
}

// ended takes the final position of a claim whose worker returned.
func (o *offsetCommitter) ended(sess sarama.ConsumerGroupSession, p int32, offset int64, meta string) {
	h := o.h
	if sess.Context().Err() != nil || h.sub.stopping(h.ctx) {
		// The session ends: finish confirms its final commit, once for
		// all its claims.
		o.mu.Lock()
		if o.final != nil {
			o.final[p] = kclient.CommittedOffset{Offset: offset, Metadata: meta}
		}
		o.mu.Unlock()
		return
	}
	// Revoked while the session goes on (cooperative): Sarama drops the
	// partition's marks once the claim returns, so its final commit is
	// confirmed now.
	ctx, cancel := h.sub.halt.within(h.sub.cfg.finalCommitWait())
	defer cancel()
	h.offsets.confirm(ctx, sess, map[int32]kclient.CommittedOffset{p: {Offset: offset, Metadata: meta}})
}

// commitSoon asks the commit loop to commit without waiting for the next
// interval. It never blocks.
func (o *offsetCommitter) commitSoon() {
	select {
	case o.soon <- struct{}{}:
	default:
	}
}

// earlyCommitGap is the least time between a commit and an early one: a
// tenth of the commit interval, at most maxEarlyCommitGap. A partition that
// keeps catching up (every record complete, none waiting) then costs at most
// ten commits per interval, and at most one per maxEarlyCommitGap.
func earlyCommitGap(interval time.Duration) time.Duration {
	return min(interval/10, maxEarlyCommitGap)
}

const maxEarlyCommitGap = 100 * time.Millisecond

// commitLoop commits the session's marks once per commit interval: it first
// marks every partition's completed tail, so that a completed record waits
// at most one interval (plus the commit's round trip) to be covered, then
// commits, then reads back what the coordinator holds (Stats'
// ConfirmedOffset). A partition with every received record complete asks
// for a commit at once (commitSoon), within earlyCommitGap; an early
// commit the coordinator did not take is sent again, paced as every
// commit read back until held (backoff.Doubling), at most
// maxEarlyCommitRetries times. It ends when the subscription stops.
func (o *offsetCommitter) commitLoop(sess sarama.ConsumerGroupSession, stop, done, soon chan struct{}) {
	defer close(done)
	h := o.h
	interval := h.sub.cfg.CommitEvery
	t := time.NewTicker(interval)
	defer t.Stop()
	var early *time.Timer
	var earlyC <-chan time.Time
	defer func() {
		if early != nil {
			early.Stop()
		}
	}()
	gap := earlyCommitGap(interval)
	last := time.Now()
	retries := 0
	var pace backoff.Doubling
	later := func(wait time.Duration) {
		if earlyC == nil {
			early = time.NewTimer(wait)
			earlyC = early.C
		}
	}
	// commitEarly commits, then reads back what the broker holds: Sarama
	// reports no failed commit to its caller, and a failed early commit
	// would otherwise wait a whole interval for the next one.
	commitEarly := func() {
		sent := h.workers.marked()
		ob := h.observeCommit()
		sess.Commit()
		ob.sentNow()
		last = time.Now()
		behind := o.confirm(sent)
		ob.confirmed()
		if behind && retries < maxEarlyCommitRetries {
			retries++
			later(pace.Next())
			return
		}
		retries = 0
		pace.Reset()
	}
	for {
		select {
		case <-t.C:
			h.workers.markTails()
			ob := h.observeCommit()
			sess.Commit()
			ob.sentNow()
			last = time.Now()
			o.confirm(nil)
			ob.confirmed()
			h.listHighWaterMarks()
		case <-soon:
			if wait := gap - time.Since(last); wait <= 0 {
				commitEarly()
			} else {
				later(wait)
			}
		case <-earlyC:
			early, earlyC = nil, nil
			commitEarly()
		case <-stop:
			return
		case <-h.sub.halt.stopped:
			// The subscription stops: Cleanup commits once, for every
			// claim, after the drains. Commits of the loop meanwhile
			// would queue at a slow coordinator ahead of that one.
			return
		}
	}
}

// maxEarlyCommitRetries bounds the early commits repeated because the
// broker did not take the previous one; after that the next interval's
// commit tries again.
const maxEarlyCommitRetries = 3

// confirm reads the committed offsets of this session's partitions.
// It reports whether any partition of sent (offsets handed to Sarama
// before a commit) is still committed below it: that commit failed.
func (o *offsetCommitter) confirm(sent map[int32]int64) (behind bool) {
	h := o.h
	workers := h.workers.list()
	parts := make([]int32, 0, len(workers))
	for _, w := range workers {
		parts = append(parts, w.Partition())
	}
	committed, err := kclient.FetchCommitted(h.client, h.sub.cfg.ConsumerGroup, h.sub.topic, parts)
	if err != nil {
		h.sub.logger.Debug("Cannot read back committed offsets", h.sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		return len(sent) > 0
	}
	for _, w := range workers {
		if c, ok := committed[w.Partition()]; ok {
			w.SetConfirmed(c.Offset)
		}
	}
	for p, c := range committed {
		if off, ok := sent[p]; ok && c.Offset < off {
			behind = true
		}
	}
	return behind
}

// sessionMarker is the session, as a partition worker marks and commits
// through it. Once the session is ending, a commit (the drain's) is left
// to Cleanup, which commits the marks of every claim at once and confirms
// them, within its bound: one commit per drain queued them behind each
// other at the coordinator, each holding its drain (and so Close) while a
// broker was slow to answer, or for Net.ReadTimeout when it did not.
type sessionMarker struct {
	sarama.ConsumerGroupSession
	h *groupHandler
}

func (m sessionMarker) Commit() {
	if m.Context().Err() == nil && !m.h.sub.stopping(m.h.ctx) {
		m.ConsumerGroupSession.Commit()
	}
}

// sessionOffsets commits positions through a group session's offset
// manager and reads back what the coordinator holds, committing again
// until it holds them: the pinned starts of a session (in either mode:
// a start has no outputs), the divergence point of a truncated log, and
// the offset committer's final positions.
type sessionOffsets struct {
	sub    *subscription
	client sarama.Client
}

// pinStarts commits a start position for the claimed partitions on which
// the group has no commit, before Sarama starts them: Offsets.Initial
// resolved now (starts, listed by Setup). Sarama then fetches from exactly
// there (the claim's InitialOffset is that offset), and the group's
// position is at the broker before any record is handed out, so a member
// that dies or loses the partition before handing a record out does not
// leave the next one to resolve Offsets.Initial afresh (at OffsetNewest,
// skipping what came in between). Partitions whose start cannot be pinned
// here (a cooperative claim added without Setup, a commit out of range, an
// error) start at their first record instead (fixStart).
//
// The marks are made here, so that Sarama's claims fetch from them; the
// commit is sent in the background, beside the claims' first fetches, and
// the returned channel closes once the coordinator holds it (see
// commitPinned). ConsumeClaim hands nothing out before that.
func (s sessionOffsets) pinStarts(sess sarama.ConsumerGroupSession, claimed []int32, committed map[int32]kclient.CommittedOffset,
	starts map[int32]int64, startErrs map[int32]error) <-chan struct{} {
	pinned := make(map[int32]int64)
	for _, p := range claimed {
		if c, ok := committed[p]; !ok || c.Offset >= 0 {
			continue
		}
		start, ok := starts[p]
		if !ok {
			fields := watermill.LogFields{"kafka_partition": p}
			if err := startErrs[p]; err != nil {
				fields["err"] = err.Error()
			}
			s.sub.logger.Debug("Cannot resolve the start offset; the partition starts at its first record",
				s.sub.logFields.Add(fields))
			continue
		}
		sess.MarkOffset(s.sub.topic, p, start, "")
		committed[p] = kclient.CommittedOffset{Offset: start}
		pinned[p] = start
		s.sub.logStartWithoutCommit(p, start)
	}
	if len(pinned) == 0 {
		return closedChan
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.commitPinned(sess, pinned)
	}()
	return done
}

// commitPinned commits the pinned starts and reads them back, committing
// again until the coordinator holds them or the session ends (see
// commitUntilHeld): a record handed out while the group has no commit is
// skipped by the next owner at OffsetNewest if this member dies before it
// is committed.
func (s sessionOffsets) commitPinned(sess sarama.ConsumerGroupSession, starts map[int32]int64) {
	want := make(map[int32]kclient.CommittedOffset, len(starts))
	for p, start := range starts {
		want[p] = kclient.CommittedOffset{Offset: start}
	}
	missing, _, err := s.commitUntilHeld(sess.Context(), sess, want, func(missing map[int32]int64, err error, retryIn time.Duration) {
		fields := watermill.LogFields{"partitions": len(missing), "retry_in": retryIn.String()}
		if err != nil {
			fields["err"] = err.Error()
		}
		s.sub.logger.Info("The start of partitions without a commit is not committed yet; nothing is handed out until it is",
			s.sub.logFields.Add(fields))
	})
	if len(missing) == 0 && err == nil {
		s.sub.logger.Debug("Committed the start of partitions without a commit",
			s.sub.logFields.Add(watermill.LogFields{"partitions": len(starts)}))
	}
}

// commitUntilHeld commits the session's marks and reads back what the
// coordinator holds for the partitions of want, committing again (paced
// by backoff.Doubling) until it holds each one's position, or a later one
// (see kclient.CommittedOffset.holds), or until ctx ends or the session is fenced.
// Sarama does not report a refused commit (a coordinator loading or moving
// the group refuses it), so only a read-back tells. One read each round,
// given up with ctx: kclient.FetchCommitted's own retries, and a coordinator that
// does not answer, would overrun a caller's bound. waiting, when not nil,
// is told of each round that found positions missing. It returns the
// positions still missing (none when all are held), what the coordinator
// last answered, and the last read's error (sentinel.ErrInstanceFenced when the
// session was fenced: its positions are not this member's to commit any
// more).
func (s sessionOffsets) commitUntilHeld(ctx context.Context, sess sarama.ConsumerGroupSession, want map[int32]kclient.CommittedOffset,
	waiting func(missing map[int32]int64, err error, retryIn time.Duration)) (missing map[int32]int64, lastHeld map[int32]kclient.CommittedOffset, err error) {
	parts := make([]int32, 0, len(want))
	for p, w := range want {
		if w.Offset >= 0 {
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return nil, nil, nil
	}
	var pace backoff.Doubling
	for !sessionFenced(sess.Context()) {
		callWithin(ctx, sess.Commit)
		var held map[int32]kclient.CommittedOffset
		held, err = fetchCommittedWithin(ctx, s.client, s.sub.cfg.ConsumerGroup, s.sub.topic, parts)
		if err == nil {
			lastHeld = held
		}
		missing = make(map[int32]int64)
		for _, p := range parts {
			w := want[p]
			if c, ok := held[p]; err != nil || !ok || !c.Holds(w) {
				missing[p] = w.Offset
			}
		}
		if len(missing) == 0 {
			return nil, lastHeld, nil
		}
		wait := pace.Next()
		if waiting != nil {
			waiting(missing, err, wait)
		}
		if !backoff.Sleep(ctx, wait) {
			return missing, lastHeld, err
		}
	}
	return missing, lastHeld, sentinel.ErrInstanceFenced
}

// confirm commits and reads back until the coordinator holds each
// partition's mark in marks (see commitUntilHeld), until ctx ends. With
// Sarama's auto-commit off, the marks of a partition whose claim ended are
// dropped without being flushed again: the next owner would handle again
// everything acked since the last commit the coordinator took. What the
// coordinator does not hold when ctx ends is logged as an Error, partition
// by partition. The assignments of marks are over: an Observer is told of
// their final positions (see subscription.observeFinal).
func (s sessionOffsets) confirm(ctx context.Context, sess sarama.ConsumerGroupSession, marks map[int32]kclient.CommittedOffset) {
	start := time.Now()
	missing, held, err := s.commitUntilHeld(ctx, sess, marks, nil)
	fenced := errors.Is(err, sentinel.ErrInstanceFenced)
	if len(missing) > 0 && !fenced {
		s.logUncommitted(missing, held, err)
	}
	if s.sub.workerCfg.Observer == nil {
		return
	}
	// A partition that never marked (-1: no record fixed its start) had
	// nothing handed out: no final position to report.
	took := time.Since(start)
	finalHeld := make(map[int32]kclient.CommittedOffset, len(marks))
	notHeld := make(map[int32]kclient.CommittedOffset)
	for p, m := range marks {
		switch _, miss := missing[p]; {
		case m.Offset < 0:
		case miss || fenced: // a fenced session's positions are the fencing member's
			notHeld[p] = m
		default:
			finalHeld[p] = m
		}
	}
	s.sub.observeFinal(start, took, false, finalHeld, notHeld, err)
}

// logUncommitted reports final positions the group coordinator does not
// hold: partition and offset of each ("uncommitted"), and what the
// coordinator held when last read ("held", when it answered).
func (s sessionOffsets) logUncommitted(missing map[int32]int64, held map[int32]kclient.CommittedOffset, err error) {
	fields := watermill.LogFields{"uncommitted": positions(missing), "partitions": len(missing)}
	if held != nil {
		offs := make(map[int32]int64, len(missing))
		for p := range missing {
			if c, ok := held[p]; ok {
				offs[p] = c.Offset
			}
		}
		fields["held"] = positions(offs)
	}
	if err == nil {
		err = errors.New("the group coordinator holds an earlier position")
	}
	s.sub.logger.Error("Final positions not committed: the next owner handles again the records acked after the position the group holds",
		err, s.sub.logFields.Add(fields))
}

// finalCommitWait bounds a final commit's confirmation: DrainTimeout, and
// at most half of what a full drain leaves of Rebalance.Timeout, so that
// the member still rejoins (eager), or gives the partition up
// (cooperative), in time.
func (c *Options) finalCommitWait() time.Duration {
	left := c.OverwriteSaramaConfig.Consumer.Group.Rebalance.Timeout - c.DrainTimeout
	return min(c.DrainTimeout, left/2)
}
