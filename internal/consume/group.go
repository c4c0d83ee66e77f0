package consume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/ready"
)

func (sub *subscription) consumeGroup(ctx context.Context, client sarama.Client) error {
	epochs := &epochClient{connection: kgoConnection(client, sub.cfg.Brokers)}
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
	gh := &groupHandler{client: client, group: group, watch: watch, member: &member{sub: sub, ctx: ctx, pauser: group, epochs: epochs,
		offsets: sessionOffsets{sub: sub, reads: reads}, reads: reads}}
	gh.commits = newCommitter(gh.member)
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
		wait, ok := rejoin.next(time.Now(), rejoinWindow(sub.cfg.OverwriteSaramaConfig), coordinatorMoving(err))
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

// groupHandler is the sarama.ConsumerGroupHandler of one subscription:
// Sarama's sessions and claims, handed to the engine-neutral member.
type groupHandler struct {
	*member
	client sarama.Client
	group  sarama.ConsumerGroup
	// watch follows the claims of each session's assignment (see claimWatch).
	watch *claimWatch
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
		starts, startErrs = h.sub.initialStarts(saramaReads{client: h.client, topic: h.sub.topic}, slices.DeleteFunc(slices.Clone(claimed), func(p int32) bool {
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
	start, err := h.prepareSession(sess, claimed, committed, err, held, starts, startErrs)
	if err != nil {
		return err // Sarama runs Cleanup
	}
	// Committed tails are read (and their records skipped) even with
	// DisableCompletedTail, which only stops this member writing them:
	// the group's earlier members may have.
	first := h.sub.fetchFirstRecords(h.client, fetchStarts(claimed, withoutPartitions(start.committed, held)))
	h.beginSession(sess, claimed, start, held, first)
	return nil
}

// Cleanup ends the session (see member.endSession).
func (h *groupHandler) Cleanup(saramaSess sarama.ConsumerGroupSession) error {
	sess := guardSession(saramaSess)
	h.watch.end(sess)
	h.endSession(sess, func() bool { return sessionFenced(sess.Context()) })
	return nil
}

// ConsumeClaim runs one partition until it is revoked.
func (h *groupHandler) ConsumeClaim(saramaSess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	sess := guardSession(saramaSess)
	h.watch.claimStarted(claim.Partition())
	defer h.watch.claimEnded(claim.Partition())
	if !h.admitClaim(sess) {
		// The session ended first, perhaps before the coordinator held
		// the start: the assignment is over, and its records are the next
		// owner's.
		return nil
	}
	defer func() {
		if h.claimReturned() {
			// Every claim is over and the subscription stops: the fetches
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
	origin, run, err := h.claimOrigin(sess, claim.Partition())
	if !run {
		return err
	}
	feed := h.claimFeed(claim)
	defer feed.close()
	return h.runClaim(sess, claim, origin, feed)
}

func (h *groupHandler) claimFeed(claim sarama.ConsumerGroupClaim) feed {
	if !h.backfillFromStart(claim) {
		return feed{messages: claim.Messages(), start: h.startOf(claim)}
	}
	done := make(chan struct{})
	return feed{messages: h.backfill(claim, done), start: h.logStart(claim), backfill: true, done: done}
}
