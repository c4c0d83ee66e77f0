package consume

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/ready"
)

// member is the engine-neutral side of one subscription's group member:
// each session's start (the commits read and checked, the pinned starts),
// its claims (claim.go) and its end, and where the completed positions go.
// An engine hands it its sessions and claims (groupHandler: Sarama's).
type member struct {
	sub *subscription
	ctx context.Context
	// pauser pauses and resumes the fetching of the claims' partitions.
	pauser partition.Pauser
	// reads is what the engine-neutral parts read of the cluster.
	reads  clusterReads
	epochs *epochClient // sends the leader-epoch checks (see checkLeaderEpochs)
	// commits is where the sessions' completed positions go, chosen once
	// (see newCommitter); offsets commits and reads back through a
	// session, in either mode (pinned starts, truncations).
	commits committer
	offsets sessionOffsets

	// hwmListing: a listing of high-water marks runs; hwmListedAt: when
	// the last one started, in Unix nanoseconds (see listHighWaterMarks).
	hwmListing  atomic.Bool
	hwmListedAt atomic.Int64

	// fenced is set by Cleanup when the coordinator fenced the session's
	// member (see sentinel.ErrInstanceFenced).
	fenced atomic.Bool

	// Per session, set in Setup and read by the claims it starts.
	mu sync.Mutex
	// starts is what Setup prepared for the session's first claim of each
	// partition (see takeClaimStart).
	starts map[int32]claimStart
	// truncatedAdded lists the partitions whose log the leader-epoch check
	// of an added claim found truncated (see checkAddedClaim): that ended
	// the session, and the next one's claim counts the truncation.
	truncatedAdded map[int32]bool
	// pinned closes once the commit of the session's pinned starts
	// returned (see pinStarts).
	pinned  <-chan struct{}
	workers WorkerSet // the running claims'
	// claims counts the claims running (see admitClaim).
	claims atomic.Int32
}

// sessionStart is what the start of a session found (see prepareSession).
type sessionStart struct {
	// committed is the group's commits of the claimed partitions, checked
	// against the log's leader epochs; nil when they could not be read.
	committed map[int32]kclient.CommittedOffset
	// truncated lists the partitions whose log the leader-epoch check
	// found truncated under the commit, unchecked those whose commit it
	// could not check yet (see checkLeaderEpochs).
	truncated, unchecked map[int32]bool
	// pinned closes once the commit of the session's pinned starts
	// returned (see pinStarts).
	pinned <-chan struct{}
}

// prepareSession starts a session whose claimed partitions' commits the
// engine read (committed, or readErr): their leader epochs are checked and
// the starts of those without a commit pinned (starts and startErrs, the
// positions listed for them). The partitions in held wait for their leaders
// and are left out of the checks, which would wait for those leaders too;
// their claims read and check their commits when they start, as the claims
// a cooperative rebalance adds do. An error ends the session.
func (h *member) prepareSession(sess groupSession, claimed []int32, committed map[int32]kclient.CommittedOffset, readErr error,
	held map[int32]bool, starts map[int32]int64, startErrs map[int32]error,
) (sessionStart, error) {
	if readErr != nil {
		if err := h.commits.withoutCommitted("committed offsets", readErr); err != nil {
			h.mu.Lock()
			h.pinned = closedChan
			h.mu.Unlock()
			return sessionStart{}, err
		}
		// Without the tail every record after the committed offset is
		// redelivered: more repeats, nothing lost. Partitions without a
		// commit start at their first record (fixStart).
		h.sub.logger.Error("Cannot read committed offsets; completed tails are not skipped this session", readErr, h.sub.logFields)
		return sessionStart{pinned: closedChan}, nil
	}
	// Epochs earlier members committed are checked even with
	// DisableCompletedTail (reading is not writing).
	checked := withoutPartitions(committed, held)
	truncated, unchecked := h.checkLeaderEpochs(sess, checked)
	maps.Copy(committed, checked)
	pinned := h.offsets.pinStarts(sess, claimed, committed, starts, startErrs)
	return sessionStart{committed: committed, truncated: truncated, unchecked: unchecked, pinned: pinned}, nil
}

// beginSession hands the session's claims what prepareSession found for
// them (see takeClaimStart), with the early fetches (first), and starts
// the session's commits.
func (h *member) beginSession(sess groupSession, claimed []int32, start sessionStart, held map[int32]bool, first map[int32]*firstFetch) {
	h.prepareClaims(claimed, start, held, first)
	h.commits.begin(sess, start.committed)
	h.sub.setPhase(ready.Consuming, nil)
}

// prepareClaims keeps, for the session's first claim of each claimed
// partition, what its start found (see takeClaimStart); a truncation no
// claim counted yet carries over to a claimed partition's.
func (h *member) prepareClaims(claimed []int32, start sessionStart, held map[int32]bool, first map[int32]*firstFetch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.starts = claimStarts(claimed, withoutPartitions(start.committed, held), start.truncated, start.unchecked, h.truncationsNotCountedLocked(), first)
	h.truncatedAdded = nil
	h.pinned = start.pinned
}

// addClaims keeps, beside what an earlier start prepared and no claim took
// yet, what the start of claims added to a running session found for them
// (see prepareSession): an engine whose session takes claims one
// assignment at a time (the consumer protocol's) prepares each assignment
// as Setup prepares a session. The claims admitted from now on wait for
// the added starts' commit too.
func (h *member) addClaims(claimed []int32, start sessionStart) {
	h.mu.Lock()
	defer h.mu.Unlock()
	added := claimStarts(claimed, start.committed, start.truncated, start.unchecked, nil, nil)
	if h.starts == nil {
		h.starts = make(map[int32]claimStart, len(added))
	}
	maps.Copy(h.starts, added)
	h.pinned = bothClosed(h.pinned, start.pinned)
}

// bothClosed returns a channel closed once a and b are (a nil one counts
// as closed).
func bothClosed(a, b <-chan struct{}) <-chan struct{} {
	switch {
	case a == nil || a == closedChan:
		if b == nil {
			return closedChan
		}
		return b
	case b == nil || b == closedChan:
		return a
	}
	out := make(chan struct{})
	go func() {
		<-a
		<-b
		close(out)
	}()
	return out
}

// endSession stops the commit loop and commits what the claims ended with. When
// the subscription stops, this final commit may wait closeCommitWait for
// the brokers (finalCommitWait at a rebalance); the shutdown deadline then
// leaves CloseGrace to leave the group.
// fenced tells, once the commit loop stopped, whether the coordinator fenced
// the member (the engine knows how it says so).
func (h *member) endSession(sess groupSession, fenced func() bool) {
	h.sub.setPhase(ready.Joining, nil) // the session is over: rejoining, or stopping
	wait := h.sub.cfg.finalCommitWait()
	closing := h.sub.halt.isStopping()
	if closing {
		wait = h.sub.cfg.closeCommitWait()
		h.sub.halt.arm(wait + CloseGrace)
	}
	ctx, cancel := h.sub.halt.within(wait)
	defer cancel()
	h.commits.stopLoop(ctx)
	h.mu.Lock()
	pinned := h.pinned
	h.mu.Unlock()
	waitOr(ctx, pinned)
	if fenced() {
		// The records are the fencing member's now: nothing more is
		// committed (sess and the transactions refuse to).
		h.fenced.Store(true)
	}
	h.commits.finish(ctx, sess)
	if closing {
		h.sub.halt.arm(CloseGrace)
	}
}

// withoutPartitions returns m without the partitions in drop: m itself
// when there are none, a copy otherwise.
func withoutPartitions[V any](m map[int32]V, drop map[int32]bool) map[int32]V {
	if len(drop) == 0 || m == nil {
		return m
	}
	out := maps.Clone(m)
	for p := range drop {
		delete(out, p)
	}
	return out
}

// closedChan is a channel that is always closed.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// withPartition returns m with partition set, made if m is nil.
func withPartition(m map[int32]bool, partition int32) map[int32]bool {
	if m == nil {
		m = make(map[int32]bool)
	}
	m[partition] = true
	return m
}

// hwmListEvery is the least time between two listings of a session's
// high-water marks: the transactional commit loop ticks every 100 ms.
const hwmListEvery = time.Second

// listHighWaterMarks lists the high-water marks of the session's
// partitions, for Stats (see WorkerSet.setHighWaterMarks), on a goroutine of its own
// so that a broker slow to answer never holds a commit up, at most one
// listing at a time and one per hwmListEvery. The commit loops call it.
func (h *member) listHighWaterMarks() {
	now := time.Now().UnixNano()
	if now-h.hwmListedAt.Load() < int64(hwmListEvery) || !h.hwmListing.CompareAndSwap(false, true) {
		return
	}
	h.hwmListedAt.Store(now)
	go func() {
		defer h.hwmListing.Store(false)
		h.sub.leaders.listed(h.workers.setHighWaterMarks(h.reads))
	}()
}
