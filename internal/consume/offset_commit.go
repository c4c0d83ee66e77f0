package consume

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/kclient"
)

// offsetCommitter is the committer of a subscription that commits offsets
// through the group session: the workers mark their completed prefix (and
// tail) in Sarama's offset manager, a commit loop commits the marks once
// per commit interval (and early for a partition that caught up), and the
// final position of each claim the session ends is committed and read back
// until the coordinator holds it (Sarama reports no refused commit, and
// drops a revoked partition's marks).
type offsetCommitter struct {
	h *member

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

func (o *offsetCommitter) begin(sess groupSession, _ map[int32]kclient.CommittedOffset) {
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
func (o *offsetCommitter) finish(ctx context.Context, sess groupSession) {
	o.mu.Lock()
	final := o.final
	o.final = nil
	o.mu.Unlock()
	o.h.offsets.confirm(ctx, sess, final)
}

func (o *offsetCommitter) claim(sess groupSession, p int32) claimCommits {
	h := o.h
	return claimCommits{
		marker:        sessionMarker{sess, h},
		requestCommit: o.commitSoon,
		startCommitted: func(offset int64) bool {
			held, err := h.reads.Committed([]int32{p})
			return err == nil && held[p].Offset == offset
		},
		ended: func(offset int64, meta string) { o.ended(sess, p, offset, meta) },
	}
}

// ended takes the final position of a claim whose worker returned.
func (o *offsetCommitter) ended(sess groupSession, p int32, offset int64, meta string) {
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
func (o *offsetCommitter) commitLoop(sess groupSession, stop, done, soon chan struct{}) {
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
	committed, err := h.reads.Committed(parts)
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
	groupSession
	h *member
}

func (m sessionMarker) Commit() {
	if m.Context().Err() == nil && !m.h.sub.stopping(m.h.ctx) {
		m.groupSession.Commit()
	}
}

// finalCommitWait bounds a final commit's confirmation: DrainTimeout, and
// at most half of what a full drain leaves of Rebalance.Timeout, so that
// the member still rejoins (eager), or gives the partition up
// (cooperative), in time.
func (c *Options) finalCommitWait() time.Duration {
	left := c.OverwriteSaramaConfig.Consumer.Group.Rebalance.Timeout - c.DrainTimeout
	return min(c.DrainTimeout, left/2)
}
