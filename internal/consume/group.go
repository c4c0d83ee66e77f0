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
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
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

	gh := &groupHandler{sub: sub, ctx: ctx, client: client, group: group, epochs: epochs, watch: watch,
		offsets: sessionOffsets{sub: sub, client: client}}
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
	committed map[int32]kclient.CommittedOffset
	// truncated lists the partitions whose log the leader-epoch check
	// found truncated under the commit, unchecked those whose commit it
	// could not check yet (see checkLeaderEpochs).
	truncated map[int32]bool
	unchecked map[int32]bool
	// pinned closes once the commit of the session's pinned starts
	// returned (see pinStarts).
	pinned <-chan struct{}
	// first holds the session's early fetches (see subscription.fetchFirstRecords).
	first   map[int32]*firstFetch
	mu      sync.Mutex
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
	committed, err := kclient.FetchCommitted(h.client, h.sub.cfg.ConsumerGroup, h.sub.topic, claimed)
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
	h.committed = withoutPartitions(committed, held)
	// A truncation found for an added claim (checkAddedClaim) ended the
	// last session; it is counted by this one's claim of the partition.
	for _, p := range claimed {
		if h.truncated[p] {
			truncated = withPartition(truncated, p)
		}
	}
	h.truncated, h.unchecked = truncated, unchecked
	h.pinned = pinned
	h.first = first
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

// kclient.CommittedOffset returns what Setup read for partition. A cooperative
// rebalance can add a claim to a running session without a new Setup; such
// a partition is read on its own (fromSetup false). A failed read is
// logged and returned.
func (h *groupHandler) committedOffset(partition int32) (c kclient.CommittedOffset, ok, fromSetup bool, err error) {
	h.mu.Lock()
	c, ok = h.committed[partition]
	// Setup's read serves the session's first claim of the partition only:
	// one that comes back later in the session (cooperative) is read again,
	// for the commit and completed tail its last owner left since.
	delete(h.committed, partition)
	h.mu.Unlock()
	if ok {
		return c, true, true, nil
	}
	fetched, err := kclient.FetchCommitted(h.client, h.sub.cfg.ConsumerGroup, h.sub.topic, []int32{partition})
	if err != nil {
		h.sub.logger.Error("Cannot read committed metadata; the completed tail is not skipped", err,
			h.sub.logFields.Add(watermill.LogFields{"kafka_partition": partition}))
		return kclient.CommittedOffset{}, false, false, err
	}
	c, ok = fetched[partition]
	return c, ok, false, nil
}

// checkAddedClaim runs the leader-epoch check (see checkLeaderEpochs) for
// a claim that came without Setup: cooperative rebalancing adds claims to
// a running session. Its fetch started at the commit already, so a
// truncation found cannot move it back: the divergence point is committed
// instead (read back until the coordinator holds it) and it reports ended:
// the claim returns, which ends the session, and the next one starts there.
// unchecked: the check could not run yet (see newEpochWatch).
func (h *groupHandler) checkAddedClaim(sess groupSession, partition int32, c kclient.CommittedOffset) (ended, unchecked bool) {
	marks := map[int32]kclient.CommittedOffset{partition: c}
	truncated, notChecked := h.checkLeaderEpochs(sess, marks)
	if len(truncated) == 0 {
		return false, notChecked[partition]
	}
	h.mu.Lock()
	h.truncated = withPartition(h.truncated, partition)
	h.mu.Unlock()
	ctx, cancel := h.sub.halt.within(h.sub.cfg.finalCommitWait())
	defer cancel()
	h.offsets.confirm(ctx, sess, marks)
	h.sub.logger.Info("Ending the session so that the truncated partition starts again where its log diverged",
		h.sub.logFields.Add(watermill.LogFields{"kafka_partition": partition, "start": marks[partition].Offset}))
	return true, false
}

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

// ConsumeClaim runs one partition until it is revoked.
func (h *groupHandler) ConsumeClaim(saramaSess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	sess := guardSession(saramaSess)
	h.watch.claimStarted(claim.Partition())
	defer h.watch.claimEnded(claim.Partition())
	// Nothing is taken from the claim, handed out or shown in Stats before
	// the session's pinned starts are committed; Sarama made the claim
	// (resolving its start, starting its fetch) meanwhile.
	h.mu.Lock()
	pinned := h.pinned
	h.mu.Unlock()
	<-pinned
	if sess.Context().Err() != nil || h.sub.stopping(h.ctx) {
		// The session ended first, perhaps before the coordinator held
		// the start: the assignment is over, and its records are the next
		// owner's.
		return nil
	}
	h.claims.Add(1)
	defer func() {
		if h.claims.Add(-1) == 0 && h.sub.halt.isStopping() {
			// Every claim is over and the subscription stops: its fetches
			// are not needed any more. Sarama runs Cleanup, and so the
			// final commit, only once each claim's partition consumer has
			// closed, which waits for a Fetch in flight (Net.ReadTimeout
			// when its leader does not answer). The coordinator's requests
			// have connections of their own.
			if tc, ok := h.client.(*kclient.TrackedClient); ok && tc.CoordConns != nil {
				tc.Client.(*kclient.CoordinatorClient).Keep()
				tc.Conns.Abandon()
			}
		}
	}()
	commit, haveCommit, fromSetup, err := h.committedOffset(claim.Partition())
	if err != nil {
		if err := h.commits.withoutCommitted("the committed offset of a claim", err); err != nil {
			return err // ends the session, whose next Setup reads the commits again
		}
	}
	var unchecked bool // the commit's leader epoch could not be checked yet
	if haveCommit && !fromSetup {
		var ended bool
		if ended, unchecked = h.checkAddedClaim(sess, claim.Partition(), commit); ended {
			return nil
		}
	}
	messages := claim.Messages()
	var start partition.Start
	backfill := h.backfillFromStart(claim)
	if backfill {
		done := make(chan struct{})
		defer close(done)
		messages = h.backfill(claim, done)
		start = h.logStart(claim)
	} else {
		start = h.startOf(claim)
	}
	// Where completed offsets go: the session's marks, or the transaction.
	commits := h.commits.claim(sess, claim.Partition())
	defer commits.done()
	a := partition.Assignment{
		Topic:          claim.Topic(),
		Partition:      claim.Partition(),
		Start:          start,
		Marker:         commits.marker,
		Deliveries:     commits.deliveries,
		Pauser:         h.group,
		HighWaterMark:  claim.HighWaterMarkOffset,
		RequestCommit:  commits.requestCommit,
		StartCommitted: commits.startCommitted,
		// A backfilled claim's start is resolved here, without a commit:
		// the worker commits it before anything is handed out, as Setup
		// does for the session's first claims (pinStarts).
		PinStart: backfill && start.Resolved,
	}
	h.mu.Lock()
	truncated := h.truncated[claim.Partition()]
	delete(h.truncated, claim.Partition())
	if fromSetup {
		unchecked = h.unchecked[claim.Partition()]
	}
	delete(h.unchecked, claim.Partition())
	if ff := h.first[claim.Partition()]; ff != nil && !backfill && start.Resolved && ff.from == start.Offset {
		a.FirstRecords = ff.records
	}
	delete(h.first, claim.Partition()) // for the session's first claim of the partition only
	h.mu.Unlock()
	var watch *epochWatch // the marks' epochs are checked while consuming (see epochWatch)
	if !h.sub.cfg.DisableCompletedTail {
		from := kclient.CommittedOffset{Offset: -1} // no commit: the claim's start is resolved later
		if haveCommit {
			from = commit
		}
		watch = newEpochWatch(h, a.Marker, claim.Topic(), claim.Partition(), from, unchecked)
		a.Marker, a.LeaderEpoch = watch, watch.epoch
	}
	w, err := h.sub.newWorker(sess.Context(), a)
	if err != nil {
		return err
	}
	commits.bind(w, commit, haveCommit)
	if truncated {
		w.CountLogTruncation()
	}
	if haveCommit {
		w.StartFromCommit(commit.Offset, commit.Metadata)
	}
	if watch != nil {
		watch.start(sess.Context(), w)
		defer watch.close()
	}
	h.workers.Add(w)
	h.sub.leaders.started(w)
	h.sub.host.Attach(w)
	defer func() {
		h.sub.host.Detach(w)
		h.sub.leaders.ended(w)
		h.workers.Remove(w)
	}()
	w.Run(messages, h.sub.host.Closing())
	commits.end(w, watch)
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
		h.sub.leaders.listed(h.workers.setHighWaterMarks(h.client, h.sub.topic))
	}()
}
