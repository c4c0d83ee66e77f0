package consume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/ready"
)

func (sub *subscription) consumeGroup(ctx context.Context, client sarama.Client) error {
	epochs := &epochClient{client: client, seeds: sub.cfg.Brokers}
	defer epochs.close() // after the group's sessions ended (group.Close below)
	watch := newClaimWatch(sub, client)
	group, err := sarama.NewConsumerGroupFromClient(sub.cfg.ConsumerGroup, &groupClient{Client: client, watch: watch})
	if err != nil {
		return fmt.Errorf("cannot create consumer group: %w", err)
	}
	errsDone := make(chan struct{})
	go func() {
		defer close(errsDone)
		for err := range group.Errors() {
			if sub.halt.isStopping() {
				// Closing the group's connections under its last fetches
				// and requests is how a subscription stops (see
				// shutdown): their errors ("use of closed network
				// connection") are the shutdown's, not a fault. A final
				// position the group does not hold is logged on its own.
				sub.logger.Debug("Sarama consumer group error while stopping", sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
				continue
			}
			sub.logger.Error("Sarama consumer group error", err, sub.logFields)
			if ce, ok := errors.AsType[*sarama.ConsumerError](err); ok && ce.Topic == sub.topic {
				watch.claimError(ce.Partition, ce.Err)
			}
		}
	}()
	defer func() {
		if err := group.Close(); err != nil {
			sub.logger.Info("Consumer group closed with error", sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		}
		<-errsDone
	}()

	reads := saramaReads{client: client, group: sub.cfg.ConsumerGroup, topic: sub.topic}
	gh := &groupHandler{sub: sub, ctx: ctx, client: client, group: group, epochs: epochs, watch: watch,
		offsets: sessionOffsets{sub: sub, reads: reads}, reads: reads}
	gh.commits = newCommitter(gh)
	var handler sarama.ConsumerGroupHandler = gh
	if sub.cfg.Tracer != nil {
		handler = sub.cfg.Tracer.WrapConsumerGroupHandler(handler)
	}
	var rejoin rejoinRetry
	for ctx.Err() == nil {
		// Consume returns at every rebalance; calling it again rejoins.
		err := group.Consume(ctx, []string{sub.topic}, handler)
		if fencedCause(err) || gh.fenced.Load() {
			// Another consumer has this member's instance id: rejoining
			// would fence it in turn (see sentinel.ErrInstanceFenced).
			return sub.fenced()
		}
		if err == nil {
			rejoin.reset()
			if !backoff.Sleep(ctx, watch.rejoinDelay()) {
				return nil
			}
			continue
		}
		if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, sarama.ErrClosedConsumerGroup) {
			return nil
		}
		// The join failed: most often the group coordinator died or moved
		// (Sarama returns a JoinGroup's connection error at once, and gives
		// up on NOT_COORDINATOR and the like after Rebalance.Retry.Max).
		// Rejoin with this consumer group, after finding the coordinator
		// again, rather than with a new client: the group keeps its member
		// id, which the coordinator (a new one loads it with the group)
		// still counts as a member for a session timeout. A new member id
		// would make the whole group wait for the old one to expire.
		wait, ok := rejoin.next(time.Now(), sub.rejoinWindow(), coordinatorMoving(err))
		if !ok {
			return err
		}
		fields := sub.logFields.Add(watermill.LogFields{"retry_in": wait.String(), "failures": rejoin.failures})
		if needsAttention(err) {
			sub.logger.Error("Cannot join the consumer group; retrying", err, fields)
		} else {
			sub.logger.Info("Cannot rejoin the consumer group; retrying with the same member", fields.Add(watermill.LogFields{"err": err.Error()}))
		}
		sub.setPhase(ready.Connecting, err)
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
		if err := client.RefreshCoordinator(sub.cfg.ConsumerGroup); err != nil {
			sub.logger.Debug("Cannot find the group coordinator", sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		}
	}
	return nil
}

// groupHandler is the sarama.ConsumerGroupHandler of one subscription.
type groupHandler struct {
	sub    *subscription
	ctx    context.Context
	client sarama.Client
	group  sarama.ConsumerGroup
	// reads is what the engine-neutral parts read of the cluster.
	reads  clusterReads
	epochs *epochClient // sends the leader-epoch checks (see checkLeaderEpochs)
	// watch follows the claims of each session's assignment (see claimWatch).
	watch *claimWatch
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
	// claims counts the ConsumeClaims running (see ConsumeClaim).
	claims atomic.Int32
}

// Setup reads the committed offsets and metadata of the claimed partitions
// (one OffsetFetch per session), pins the start of those without a commit
// (see pinStarts) and starts the session's commits.
func (h *groupHandler) Setup(saramaSess sarama.ConsumerGroupSession) error {
	sess := guardSession(saramaSess)
	claimed := sess.Claims()[h.sub.topic]
	h.sub.logger.Debug("Consumer group session started", h.sub.logFields.Add(watermill.LogFields{
		"generation": sess.GenerationID(), "member": sess.MemberID(), "partitions": fmt.Sprint(claimed),
	}))
	// The start offsets are listed beside the OffsetFetch rather than after
	// it, so that pinning costs no round trip of its own: a partition that
	// turns out to have a commit wastes a block of a request made anyway.
	var starts map[int32]int64
	var startErrs map[int32]error
	var listing sync.WaitGroup
	listing.Go(func() {
		// A partition the metadata names no leader for (Sarama refreshed
		// it as it joined) is not asked: asking would refresh it again,
		// with Sarama's retries, for each such partition.
		noLeader := leaderlessPartitions(h.client, h.sub.topic, claimed)
		starts, startErrs = h.sub.initialStarts(h.client, slices.DeleteFunc(slices.Clone(claimed), func(p int32) bool {
			return noLeader[p] != nil
		}))
		maps.Copy(startErrs, noLeader)
	})
	committed, err := h.reads.Committed(claimed)
	listing.Wait()
	// The claims of partitions whose leaders did not answer wait for them
	// (see claimWatch). They are left out of the checks and fetches below,
	// which would wait for those leaders too; when they start, they read
	// and check their commits as the claims a cooperative rebalance adds do
	// (see kclient.CommittedOffset).
	held := h.watch.begin(sess, claimed, startErrs)
	if err != nil {
		if err := h.commits.withoutCommitted("committed offsets", err); err != nil {
			// Sarama runs Cleanup.
			h.mu.Lock()
			h.pinned = closedChan
			h.mu.Unlock()
			return err
		}
	}
	var pinned <-chan struct{} = closedChan
	var truncated, unchecked map[int32]bool
	if err != nil {
		// Without the tail every record after the committed offset is
		// redelivered: more repeats, nothing lost. Partitions without a
		// commit start at their first record (fixStart).
		h.sub.logger.Error("Cannot read committed offsets; completed tails are not skipped this session", err, h.sub.logFields)
		committed = nil
	} else {
		// Epochs earlier members committed are checked even with
		// DisableCompletedTail (reading is not writing).
		checked := withoutPartitions(committed, held)
		truncated, unchecked = h.checkLeaderEpochs(sess, checked)
		maps.Copy(committed, checked)
		pinned = h.offsets.pinStarts(sess, claimed, committed, starts, startErrs)
	}
	// Committed tails are read (and their records skipped) even with
	// DisableCompletedTail, which only stops this member writing them:
	// the group's earlier members may have.
	first := h.sub.fetchFirstRecords(h.client, fetchStarts(claimed, withoutPartitions(committed, held)))
	h.mu.Lock()
	h.starts = claimStarts(claimed, withoutPartitions(committed, held), truncated, unchecked, h.truncationsNotCountedLocked(), first)
	h.truncatedAdded = nil
	h.pinned = pinned
	h.mu.Unlock()
	h.commits.begin(sess, committed)
	h.sub.setPhase(ready.Consuming, nil)
	return nil
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

// Cleanup stops the commit loop and commits what the claims ended with. When
// the subscription stops, this final commit may wait closeCommitWait for
// the brokers (finalCommitWait at a rebalance); the shutdown deadline then
// leaves CloseGrace to leave the group.
func (h *groupHandler) Cleanup(saramaSess sarama.ConsumerGroupSession) error {
	sess := guardSession(saramaSess)
	h.watch.end(sess)
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
	if sessionFenced(sess.Context()) {
		// The records are the fencing member's now: nothing more is
		// committed (sess and the transactions refuse to).
		h.fenced.Store(true)
	}
	h.commits.finish(ctx, sess)
	if closing {
		h.sub.halt.arm(CloseGrace)
	}
	return nil
}

// hwmListEvery is the least time between two listings of a session's
// high-water marks: the transactional commit loop ticks every 100 ms.
const hwmListEvery = time.Second

// listHighWaterMarks lists the high-water marks of the session's
// partitions, for Stats (see WorkerSet.setHighWaterMarks), on a goroutine of its own
// so that a broker slow to answer never holds a commit up, at most one
// listing at a time and one per hwmListEvery. The commit loops call it.
func (h *groupHandler) listHighWaterMarks() {
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
