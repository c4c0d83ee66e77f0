package consume

// The consumer group protocol (KIP-848) on franz-go's kgo: the broker's
// coordinator assigns the partitions and the member reconciles on its own
// heartbeat, with no group-wide stop. kgo runs the membership and the
// fetches; the engine-neutral member runs the claims, as it does Sarama's.
//
// The member's session lasts as long as the kgo client's membership: each
// assignment adds claims to it, each revocation ends some, as a cooperative
// rebalance does in the classic engine. A revoked partition drains and
// commits inside kgo's OnPartitionsRevoked, which the member acknowledges to
// the coordinator only once it returns: the next owner starts from that
// commit. Commits are safeack's own OffsetCommit (kgoSession.Commit), with
// the member's id and epoch, for the partitions it owns only.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/backoff"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
	"github.com/safeack/safeack/internal/ready"
	"github.com/safeack/safeack/internal/sentinel"
)

// kgoGroup is one connection's member of a consumer-protocol group.
type kgoGroup struct {
	*member
	reads *kgoReads   // through the subscription's client, not cl
	cl    *kgo.Client // the member's: the membership and the fetches
	sess  *kgoSession
	held  kgoHeld // the claims waiting for their leaders

	// started closes once cl and sess are set: kgo may call back before
	// NewClient returns.
	started chan struct{}
	// fencedCh closes (once, fenceOnce) when the coordinator fenced the
	// member's instance id (see fence).
	fencedCh  chan struct{}
	fenceOnce sync.Once
	// joined: the coordinator took the member in once (see watchJoined).
	joined atomic.Bool
	// heartbeats: whether the member's heartbeats reach its coordinator
	// (see watchHeartbeats).
	heartbeats heartbeatLog

	mu     sync.Mutex
	claims map[int32]*kgoClaim
	// from is where kgo fetches each assigned partition from, as the
	// member's start decided (see assigned); absent: kgo's own choice.
	from map[int32]int64
	// unassigned lists the partitions revoked or lost since their last
	// assignment: a held claim released meanwhile does not start.
	unassigned map[int32]bool
	// claimsDone counts the running claims' goroutines.
	claimsDone sync.WaitGroup

	refusals joinRefusals // see refusedJoin
}

// consumeGroupKgo runs the subscription's member of a consumer-protocol
// group until ctx ends or the membership fails. conn's client is the
// subscription's (see connectKgo): the reads of the cluster, the
// leader-epoch checks and a static member's leave go through it; the
// member runs on a client of its own, which joins the group as it is
// made.
func (sub *subscription) consumeGroupKgo(ctx context.Context, conn conn) error {
	client := conn.kgo
	reads := newKgoReads(client, sub.cfg, sub.topic)
	epochs := &epochClient{client: client}
	g := &kgoGroup{reads: reads, claims: make(map[int32]*kgoClaim), from: make(map[int32]int64), started: make(chan struct{}), fencedCh: make(chan struct{})}
	g.member = &member{sub: sub, ctx: ctx, epochs: epochs, reads: reads, offsets: sessionOffsets{sub: sub, reads: reads}}
	g.commits = newCommitter(g.member)
	g.pauser = kgoPauser{g}
	g.held = kgoHeld{g: g, overdueAfter: claimOverdueAfter(sub.cfg.OverwriteSaramaConfig)}

	if err := g.checkTopic(ctx, client); err != nil {
		return err
	}
	// The connection's config: its dialer is the connection's tracker,
	// whose connections the shutdown deadline closes.
	opts, err := kclient.KgoOptions(conn.kgoConf)
	if err != nil {
		return err
	}
	opts = append(opts, kgo.SeedBrokers(sub.cfg.Brokers...))
	opts = append(opts, kgoGroupOptions(sub.cfg)...)
	opts = append(opts,
		kgo.ConsumeTopics(sub.topic),
		kgo.OnPartitionsAssigned(g.assigned),
		kgo.AdjustFetchOffsetsFn(g.adjustOffsets),
		kgo.OnPartitionsRevoked(g.revoked),
		kgo.OnPartitionsLost(g.lost),
		kgo.WithHooks(kgoFenceHook{g}, &g.heartbeats),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("cannot create the consumer-protocol client: %w", err)
	}
	g.cl = cl
	reads.member.Store(cl)
	sessCtx, endSess := context.WithCancelCause(ctx)
	g.sess = newKgoSession(sessCtx, cl, sub.cfg.ConsumerGroup, sub.topic, sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId,
		sub.halt.abandoned, sub.logger, sub.logFields)
	g.sess.fenced = g.fence
	g.commits.begin(g.sess, nil)
	g.mu.Lock()
	g.pinned = closedChan
	g.mu.Unlock()
	close(g.started)

	go g.watchJoined(sessCtx)
	go g.watchHeartbeats(sessCtx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		g.poll(sessCtx)
	}()
	fenced := false
	select {
	case <-ctx.Done():
	case <-g.fencedCh:
		// The partitions are the fencing member's: nothing more is
		// committed for them (the claims' drains and the final commit
		// find none owned), and the member does not rejoin.
		fenced = true
		g.sess.disownAll()
	}
	// The subscription stops: every claim drains and the session's final
	// commit covers them (see member.endSession), before kgo leaves the
	// group (its revocation then finds no claim).
	endSess(context.Canceled)
	g.held.forget(nil)
	g.stopClaims(nil)
	g.claimsDone.Wait()
	g.endSession(g.sess, func() bool { return fenced })
	g.sess.disownAll()
	// Leaving the group waits for the coordinator: not past the
	// shutdown's deadline (see shutdown). The leave is sent before the
	// client closes, so that a static member's instance id is free for
	// its restart at once.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		memberID, _ := cl.GroupMetadata()
		cl.Close()
		if id := sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId; id != "" && !fenced {
			g.leaveStatic(client, memberID, id)
		}
	}()
	select {
	case <-closed:
		<-polled
	case <-g.sub.halt.abandoned:
	}
	if fenced {
		return sub.fenced()
	}
	return nil
}

// checkTopic fails when the cluster does not have the topic, or refuses to
// describe it, as Sarama's consumer group fails before it joins: the
// subscription logs the error and connects again (see subscription.run).
// franz-go's member would join and wait for the topic without a word. As
// Sarama's metadata requests, it has the cluster create the topic when
// Metadata.AllowAutoTopicCreation is set and the cluster does so.
func (g *kgoGroup) checkTopic(ctx context.Context, client *kgo.Client) error {
	sc := g.sub.cfg.OverwriteSaramaConfig
	ctx, cancel := context.WithTimeout(ctx, requestBound(sc))
	defer cancel()
	_, err := topicMetadata(ctx, client, g.sub.topic, sc.Metadata.AllowAutoTopicCreation)
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.TopicAuthorizationFailed) {
		return err
	}
	return nil // another error: the member's own requests meet it, or it passes
}

// kgoGroupOptions are the kgo options of a consumer-protocol member, from
// the subscription's options (see SubscriberConfig.GroupProtocol).
func kgoGroupOptions(cfg *Options) []kgo.Opt {
	sc := cfg.OverwriteSaramaConfig
	balancer := kgo.StickyBalancer() // the coordinator's "uniform" assignor
	if cfg.ServerAssignor == "range" {
		balancer = kgo.RangeBalancer()
	}
	reset := kgo.NewOffset().AtEnd()
	if sc.Consumer.Offsets.Initial == sarama.OffsetOldest {
		reset = kgo.NewOffset().AtStart()
	}
	opts := []kgo.Opt{
		kgo.ConsumerGroup(cfg.ConsumerGroup),
		kgo.ServerSideBalancer(),
		kgo.Balancers(balancer),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(reset),
		kgo.RebalanceTimeout(sc.Consumer.Group.Rebalance.Timeout),
		kgo.FetchMaxWait(sc.Consumer.MaxWaitTime),
		kgo.FetchMinBytes(sc.Consumer.Fetch.Min),
		kgo.FetchMaxPartitionBytes(sc.Consumer.Fetch.Default),
		kgo.RetryBackoffFn(memberRetryBackoff),
	}
	if sc.Consumer.Fetch.Max > 0 {
		opts = append(opts, kgo.FetchMaxBytes(sc.Consumer.Fetch.Max))
	}
	if sc.Consumer.IsolationLevel == sarama.ReadCommitted {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	if id := sc.Consumer.Group.InstanceId; id != "" {
		opts = append(opts, kgo.InstanceID(id))
	}
	return opts
}

// memberRetryBackoff is the wait of a consumer-protocol member's kgo
// client before retrying a failed request (a heartbeat, a coordinator or
// metadata lookup, a fetch): from 100 ms, doubling, at most 1 s, less up
// to a fifth at random, as Kafka's own consumer waits (retry.backoff.ms,
// retry.backoff.max.ms). kgo's default grows to 5 s, past a group session
// timeout set short (group.consumer.session.timeout.ms, down to the
// broker's minimum): a coordinator that restarts starts each member's
// session timer once it has loaded the group, and a member whose
// heartbeat then still waits out a long backoff is expired
// (UNKNOWN_MEMBER_ID), loses its partitions and replays what it completed
// since its last commit. Seen in the chaos suite's broker restart, with
// 3 s sessions: the heartbeats met COORDINATOR_LOAD_IN_PROGRESS, waited
// 5 s, and all but one member were expired.
func memberRetryBackoff(fails int) time.Duration {
	const first, most = 100 * time.Millisecond, time.Second
	d := first
	for i := 1; i < fails && d < most; i++ {
		d *= 2
	}
	d = min(d, most)
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// assigned starts the claims of the partitions the coordinator added (see
// startClaims). Those whose leaders do not answer the listing of their
// starts wait, their fetching paused, until their leaders answer (see
// kgoHeld), as the classic engine's claims of such partitions wait.
func (g *kgoGroup) assigned(_ context.Context, _ *kgo.Client, added map[string][]int32) {
	<-g.started
	parts := slices.Clone(added[g.sub.topic])
	if len(parts) == 0 || g.sess.Context().Err() != nil {
		return
	}
	slices.Sort(parts)
	g.sess.own(parts)
	g.mu.Lock()
	for _, p := range parts {
		delete(g.unassigned, p)
	}
	g.mu.Unlock()
	// A partition paused by its last claim starts again unpaused.
	g.cl.ResumeFetchPartitions(map[string][]int32{g.sub.topic: parts})
	g.sub.logger.Debug("Partitions assigned", g.sub.logFields.Add(watermill.LogFields{"partitions": fmt.Sprint(parts)}))
	starts, startErrs := g.sub.initialStarts(g.reads, parts)
	var held []int32
	for _, p := range parts {
		if startErrs[p] != nil {
			held = append(held, p)
		}
	}
	if len(held) > 0 {
		g.cl.PauseFetchPartitions(map[string][]int32{g.sub.topic: held})
		g.held.hold(held, startErrs)
		parts = slices.DeleteFunc(parts, func(p int32) bool { return startErrs[p] != nil })
	}
	g.startClaimsFrom(parts, starts, startErrs, false)
}

// startClaims starts the claims of held partitions whose leaders answer
// now (see kgoHeld): their starts are listed again, and their fetching
// resumes from where their claims start. One whose listing fails again is
// held again.
func (g *kgoGroup) startClaims(parts []int32, late bool) {
	starts, startErrs := g.sub.initialStarts(g.reads, parts)
	if len(startErrs) > 0 {
		var again []int32
		for p := range startErrs {
			again = append(again, p)
		}
		g.held.hold(again, startErrs)
		parts = slices.DeleteFunc(slices.Clone(parts), func(p int32) bool { return startErrs[p] != nil })
	}
	g.startClaimsFrom(parts, starts, startErrs, late)
}

// unassign records that parts were revoked or lost (see unassigned).
func (g *kgoGroup) unassign(parts []int32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unassigned == nil {
		g.unassigned = make(map[int32]bool)
	}
	for _, p := range parts {
		g.unassigned[p] = true
	}
}

// startClaimsFrom starts the claims of parts, whose starts at
// Offsets.Initial are listed in starts (or failed, startErrs): as Sarama's
// Setup does for a session, their commits are read and checked and the
// starts of those without one pinned; kgo then fetches from exactly there
// (adjustOffsets at an assignment; late, for claims held back, SetOffsets
// before their fetching resumes).
func (g *kgoGroup) startClaimsFrom(parts []int32, starts map[int32]int64, startErrs map[int32]error, late bool) {
	if len(parts) == 0 {
		return
	}
	committed, readErr := g.reads.Committed(parts)
	start, err := g.prepareSession(g.sess, parts, committed, readErr, nil, starts, startErrs)
	if err != nil {
		g.sub.logger.Error("Cannot start the assigned partitions' claims", err, g.sub.logFields)
		start = sessionStart{pinned: closedChan}
	}
	g.addClaims(parts, start)
	from := fetchStarts(parts, start.committed)
	// A commit outside the log (below its start, above its end) is
	// fetched from Offsets.Initial, as Sarama's claims do
	// (Consumer.Group.ResetInvalidOffsets); the first record fixes the
	// claim's start (see fixStart), as it does for theirs.
	reset := g.outOfRange(from)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sess.Context().Err() != nil {
		return // stopping: no claim starts after stopClaims
	}
	owned := g.sess.Claims()[g.sub.topic]
	for _, p := range parts {
		if late && (g.unassigned[p] || !slices.Contains(owned, p) || g.claims[p] != nil) {
			continue // revoked while it was held
		}
		start := partition.Start{Offset: 0}
		delete(g.from, p)
		if off, ok := from[p]; ok {
			start = partition.Start{Offset: off, Resolved: true}
			g.from[p] = off
		}
		if reset[p] {
			delete(g.from, p)
			start = partition.Start{}
			if off, ok := starts[p]; ok {
				start.Offset = off
				g.from[p] = off
			}
		}
		if late {
			if off, ok := g.from[p]; ok {
				g.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{g.sub.topic: {p: {Epoch: -1, Offset: off}}})
			}
			g.cl.ResumeFetchPartitions(map[string][]int32{g.sub.topic: {p}})
		}
		c := newKgoClaim(g.sub.topic, p, g.sub.cfg.OverwriteSaramaConfig.ChannelBufferSize)
		g.claims[p] = c
		g.claimsDone.Add(1)
		go g.runKgoClaim(c, start)
	}
}

// outOfRange lists the partitions whose fetch start in from lies outside
// their log. A listing that fails leaves its partitions to kgo, which
// resets an offset out of range to Offsets.Initial.
func (g *kgoGroup) outOfRange(from map[int32]int64) map[int32]bool {
	if len(from) == 0 {
		return nil
	}
	parts := make([]int32, 0, len(from))
	for p := range from {
		parts = append(parts, p)
	}
	first, _ := g.reads.ListOffsets(parts, sarama.OffsetOldest)
	end, _ := g.reads.ListOffsets(parts, sarama.OffsetNewest)
	out := make(map[int32]bool)
	for p, off := range from {
		if lo, ok := first[p]; ok && off < lo {
			out[p] = true
		}
		if hi, ok := end[p]; ok && off > hi {
			out[p] = true
		}
	}
	return out
}

// adjustOffsets has kgo fetch each added partition from where its claim
// starts (see assigned), without kgo's own truncation check: the member's
// leader-epoch check runs instead.
func (g *kgoGroup) adjustOffsets(_ context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	<-g.started
	g.mu.Lock()
	defer g.mu.Unlock()
	for p := range offsets[g.sub.topic] {
		if off, ok := g.from[p]; ok {
			offsets[g.sub.topic][p] = kgo.NewOffset().At(off).WithEpoch(-1)
		}
	}
	return offsets, nil
}

// revoked drains the revoked partitions' claims and commits their final
// positions (within DrainTimeout, then the final commit's bound) before
// kgo acknowledges the revocation to the coordinator.
func (g *kgoGroup) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	<-g.started
	parts := revoked[g.sub.topic]
	if len(parts) == 0 {
		return
	}
	g.sub.logger.Debug("Partitions revoked", g.sub.logFields.Add(watermill.LogFields{"partitions": fmt.Sprint(parts)}))
	g.unassign(parts)
	g.held.forget(parts)
	g.waitClaims(g.stopClaims(parts))
	g.sess.disown(parts)
}

// lost ends the claims of partitions the member lost (fenced, or expired
// at the coordinator): they are another member's now, and nothing more is
// committed for them.
func (g *kgoGroup) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	<-g.started
	parts := lost[g.sub.topic]
	if len(parts) == 0 {
		return
	}
	g.sub.logger.Info("Partitions lost; their records are the next owner's", g.sub.logFields.Add(watermill.LogFields{"partitions": fmt.Sprint(parts)}))
	g.unassign(parts)
	g.sess.disown(parts)
	g.held.forget(parts)
	g.waitClaims(g.stopClaims(parts))
	g.sub.setPhase(ready.Joining, nil)
	go g.watchJoined(g.sess.Context())
}

// stopClaims closes the feeds of the claims of parts (all when nil) and
// returns them.
func (g *kgoGroup) stopClaims(parts []int32) []*kgoClaim {
	g.mu.Lock()
	defer g.mu.Unlock()
	var stopped []*kgoClaim
	for p, c := range g.claims {
		if parts == nil || slices.Contains(parts, p) {
			c.stop()
			delete(g.claims, p)
			stopped = append(stopped, c)
		}
	}
	return stopped
}

// waitClaims waits for the claims to return: their drain (DrainTimeout)
// and final commit (finalCommitWait), with a second of slack.
func (g *kgoGroup) waitClaims(claims []*kgoClaim) {
	deadline := time.NewTimer(g.sub.cfg.DrainTimeout + g.sub.cfg.finalCommitWait() + time.Second)
	defer deadline.Stop()
	for _, c := range claims {
		select {
		case <-c.done:
		case <-deadline.C:
			g.sub.logger.Error("A revoked partition's claim did not end in time; giving it up", nil,
				g.sub.logFields.Add(watermill.LogFields{"kafka_partition": c.partition}))
			return
		}
	}
}

// runKgoClaim runs one claim, as Sarama's ConsumeClaim does. A claim that
// ends on its own while its partition is still assigned (a truncated log
// found by the leader-epoch checks: its drain committed the divergence
// point) starts again from the group's commit, as the classic engine's
// next session does.
func (g *kgoGroup) runKgoClaim(c *kgoClaim, start partition.Start) {
	defer g.claimsDone.Done()
	defer close(c.done)
	defer c.stop() // the feed's goroutine ends
	if !g.admitClaim(g.sess) {
		return
	}
	o, run, err := g.claimOrigin(g.sess, c.partition)
	if run {
		err = g.runClaim(g.sess, c, o, feed{messages: c.out, start: start, watching: c.watching, diverging: c.diverging})
	}
	g.claimReturned()
	if err != nil {
		g.sub.logger.Error("Claim ended with an error", err, g.sub.logFields.Add(watermill.LogFields{"kafka_partition": c.partition}))
	}
	select {
	case <-c.stopped: // revoked, lost or closing
		return
	default:
	}
	g.restartClaim(c)
}

// restartClaim starts the claim of c's partition again, fetching from the
// group's commit, unless the partition was revoked meanwhile.
func (g *kgoGroup) restartClaim(c *kgoClaim) {
	c.stop()
	if !backoff.Wait(g.sess.Context(), g.sub.cfg.retrySleep(), g.sub.host.Closing()) {
		return
	}
	p := c.partition
	committed, err := g.reads.Committed([]int32{p})
	start := partition.Start{}
	if cm, ok := committed[p]; err == nil && ok && cm.Offset >= 0 {
		start = partition.Start{Offset: cm.Offset, Resolved: true}
	} else if starts, _ := g.sub.initialStarts(g.reads, []int32{p}); len(starts) > 0 {
		start = partition.Start{Offset: starts[p], Resolved: true}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.claims[p] != c || g.sess.Context().Err() != nil {
		return
	}
	if start.Resolved {
		g.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{g.sub.topic: {p: {Epoch: -1, Offset: start.Offset}}})
	}
	g.sub.logger.Info("Starting the claim again from the group's commit", g.sub.logFields.Add(watermill.LogFields{
		"kafka_partition": p, "start": start.Offset}))
	next := newKgoClaim(g.sub.topic, p, g.sub.cfg.OverwriteSaramaConfig.ChannelBufferSize)
	g.claims[p] = next
	g.claimsDone.Add(1)
	go g.runKgoClaim(next, start)
}

// poll hands the fetched records to their claims until ctx ends.
func (g *kgoGroup) poll(ctx context.Context) {
	for ctx.Err() == nil {
		fs := g.cl.PollFetches(ctx)
		if fs.IsClientClosed() {
			return
		}
		fs.EachError(func(topic string, p int32, err error) {
			if ctx.Err() != nil || errors.Is(err, context.Canceled) || g.refusedJoin(err) {
				return
			}
			if lost, ok := errors.AsType[*kgo.ErrDataLoss](err); ok && topic == g.sub.topic {
				g.dataLoss(lost)
				return
			}
			if errors.Is(err, kerr.FencedInstanceID) || errors.Is(err, kerr.UnreleasedInstanceID) {
				return // told by kgoFenceHook
			}
			g.sub.logger.Error("Fetch error", err, g.sub.logFields.Add(watermill.LogFields{"kafka_partition": p}))
		})
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if fp.Topic != g.sub.topic || len(fp.Records) == 0 {
				return
			}
			g.mu.Lock()
			c := g.claims[fp.Partition]
			g.mu.Unlock()
			if c == nil {
				return // revoked meanwhile: the next owner fetches them
			}
			c.hwm.Store(fp.HighWatermark)
			recs := make([]kgoRecord, len(fp.Records))
			top := int32(-1)
			for i, r := range fp.Records {
				recs[i] = kgoRecord{msg: consumerMessage(r), epoch: r.LeaderEpoch}
				top = max(top, r.LeaderEpoch)
			}
			g.reads.sawEpoch(fp.Partition, top)
			c.push(recs)
		})
	}
}

// dataLoss hands franz-go's finding that a partition's log lost records
// to the partition's claim. franz-go checks the leader epoch of what it
// fetched on its own when the partition's leader changes (KIP-320), and,
// when the new leader's log diverged below its fetch position, moves the
// fetch back to the divergence point (or, where it cannot tell where,
// to Offsets.Initial) and says so with an ErrDataLoss. The records the
// claim took or queued from there on are then not the log's: the claim
// ends as for a truncation its own epoch watch finds (the marks held at
// the divergence point), and starts again from the group's commit. This
// is what holds when the claim's own check could not run (an
// OffsetForLeaderEpoch refused): before, the records franz-go fetched
// again were below what the claim had taken, refused, and the partition
// stopped until its next assignment.
func (g *kgoGroup) dataLoss(lost *kgo.ErrDataLoss) {
	g.mu.Lock()
	c := g.claims[lost.Partition]
	g.mu.Unlock()
	g.sub.logger.Info("The client found the partition's log diverged from what it fetched", g.sub.logFields.Add(watermill.LogFields{
		"kafka_partition": lost.Partition, "consumed_to": lost.ConsumedTo, "reset_to": lost.ResetTo, "claimed": c != nil}))
	if c != nil {
		c.diverged(lost.ResetTo)
	}
}

// consumerMessage is r as the Sarama-typed Unmarshaler, OrderingKey and
// OnUnmarshalError take it.
func consumerMessage(r *kgo.Record) *sarama.ConsumerMessage {
	m := &sarama.ConsumerMessage{
		Key: r.Key, Value: r.Value, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Timestamp: r.Timestamp,
	}
	if len(r.Headers) > 0 {
		m.Headers = make([]*sarama.RecordHeader, len(r.Headers))
		for i, h := range r.Headers {
			m.Headers[i] = &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value}
		}
	}
	return m
}

// kgoPauser pauses the fetching of partitions in the kgo client.
type kgoPauser struct{ g *kgoGroup }

func (p kgoPauser) Pause(tps map[string][]int32)  { p.g.cl.PauseFetchPartitions(tps) }
func (p kgoPauser) Resume(tps map[string][]int32) { p.g.cl.ResumeFetchPartitions(tps) }

var _ partition.Pauser = kgoPauser{}

// checkConsumerProtocol fails when the cluster does not run the consumer
// group protocol (KIP-848, generally available from Kafka 4.0): franz-go
// would otherwise fall back to the classic protocol without a word, and
// the subscription would run on a protocol its config did not ask for. The
// request alone does not tell (Kafka 3.7-3.9 serve ConsumerGroupHeartbeat
// as an early access); the group.version feature does, where the cluster
// lists its finalized features.
func (sub *subscription) checkConsumerProtocol(ctx context.Context, client conn) error {
	if client.kgo == nil {
		return nil // not a consumer-protocol member (see connect)
	}
	ctx, cancel := context.WithTimeout(ctx, requestBound(sub.cfg.OverwriteSaramaConfig))
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, client.kgo)
	if err != nil {
		return fmt.Errorf("asking the broker which requests it serves (GroupProtocolConsumer): %w", err)
	}
	served := false
	for _, k := range resp.ApiKeys {
		served = served || k.ApiKey == int16(kmsg.ConsumerGroupHeartbeat)
	}
	level := int16(-1) // unknown: the cluster lists no finalized feature
	for _, f := range resp.FinalizedFeatures {
		if level < 0 {
			level = 0
		}
		if f.Name == "group.version" {
			level = f.MaxVersionLevel
		}
	}
	if !served || level == 0 {
		return fmt.Errorf("%w: GroupProtocol is GroupProtocolConsumer, but the cluster does not run the consumer group protocol (KIP-848: ConsumerGroupHeartbeat served %v, group.version %d; Kafka 4.0+): use GroupProtocolClassic", sentinel.ErrInvalidConfig, served, level)
	}
	return nil
}
