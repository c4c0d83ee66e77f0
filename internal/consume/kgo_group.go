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
	reads  *kgoReads
	sarama sarama.Client // answers clusterReads and lists the starts
	cl     *kgo.Client
	sess   *kgoSession

	// started closes once cl and sess are set: kgo may call back before
	// NewClient returns.
	started chan struct{}

	mu     sync.Mutex
	claims map[int32]*kgoClaim
	// from is where kgo fetches each assigned partition from, as the
	// member's start decided (see assigned); absent: kgo's own choice.
	from map[int32]int64
	// claimsDone counts the running claims' goroutines.
	claimsDone sync.WaitGroup
}

// consumeGroupKgo runs the subscription's member of a consumer-protocol
// group until ctx ends or the membership fails.
func (sub *subscription) consumeGroupKgo(ctx context.Context, client sarama.Client) error {
	reads := &kgoReads{saramaReads: saramaReads{client: client, group: sub.cfg.ConsumerGroup, topic: sub.topic}, epochs: make(map[int32]int32)}
	epochs := &epochClient{connection: kgoConnection(client, sub.cfg.Brokers)}
	defer epochs.close()
	g := &kgoGroup{reads: reads, sarama: client, claims: make(map[int32]*kgoClaim), from: make(map[int32]int64), started: make(chan struct{})}
	g.member = &member{sub: sub, ctx: ctx, epochs: epochs, reads: reads, offsets: sessionOffsets{sub: sub, reads: reads}}
	g.commits = newCommitter(g.member)
	g.pauser = kgoPauser{g}

	opts, err := kgoConnection(client, sub.cfg.Brokers)()
	if err != nil {
		return err
	}
	opts = append(opts, kgoGroupOptions(sub.cfg)...)
	opts = append(opts,
		kgo.ConsumeTopics(sub.topic),
		kgo.OnPartitionsAssigned(g.assigned),
		kgo.AdjustFetchOffsetsFn(g.adjustOffsets),
		kgo.OnPartitionsRevoked(g.revoked),
		kgo.OnPartitionsLost(g.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("cannot create the consumer-protocol client: %w", err)
	}
	g.cl = cl
	sessCtx, endSess := context.WithCancelCause(ctx)
	g.sess = newKgoSession(sessCtx, cl, sub.cfg.ConsumerGroup, sub.topic, sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId, sub.logger, sub.logFields)
	g.commits.begin(g.sess, nil)
	g.mu.Lock()
	g.pinned = closedChan
	g.mu.Unlock()
	close(g.started)

	go g.watchJoined(sessCtx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		g.poll(sessCtx)
	}()
	<-ctx.Done()
	// The subscription stops: every claim drains and the session's final
	// commit covers them (see member.endSession), before kgo leaves the
	// group (its revocation then finds no claim).
	endSess(context.Canceled)
	g.stopClaims(nil)
	g.claimsDone.Wait()
	g.endSession(g.sess, func() bool { return false })
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
		if id := sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId; id != "" {
			g.leaveStatic(client, memberID, id)
		}
	}()
	select {
	case <-closed:
		<-polled
	case <-g.sub.halt.abandoned:
	}
	return nil
}

// leaveStatic sends a static member's leave (member epoch -2, with its
// instance id) once its client closed: franz-go's own leave names no
// instance id, which Kafka refuses (INVALID_REQUEST), and the instance id
// would stay taken until the member's session expired, refusing the
// member's restart (UNRELEASED_INSTANCE_ID).
func (g *kgoGroup) leaveStatic(client sarama.Client, memberID, instanceID string) {
	if memberID == "" {
		return
	}
	ctx, cancel := g.sub.halt.within(CloseGrace)
	defer cancel()
	err := func() error {
		opts, err := kgoConnection(client, g.sub.cfg.Brokers)()
		if err != nil {
			return err
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return err
		}
		defer cl.Close()
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Group, req.MemberID, req.MemberEpoch, req.InstanceID = g.sub.cfg.ConsumerGroup, memberID, -2, &instanceID
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
			return err
		}
		return nil
	}()
	if err != nil {
		g.sub.logger.Info("Cannot leave the consumer group; the coordinator keeps the instance id until the member's session expires",
			g.sub.logFields.Add(watermill.LogFields{"err": err.Error(), "instance_id": instanceID}))
	}
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

// assigned starts the claims of the partitions the coordinator added: as
// Sarama's Setup does for a session, their commits are read and checked
// and the starts of those without one pinned; kgo then fetches from
// exactly there (adjustOffsets).
func (g *kgoGroup) assigned(_ context.Context, _ *kgo.Client, added map[string][]int32) {
	<-g.started
	parts := slices.Clone(added[g.sub.topic])
	if len(parts) == 0 || g.sess.Context().Err() != nil {
		return
	}
	slices.Sort(parts)
	g.sess.own(parts)
	// A partition paused by its last claim starts again unpaused.
	g.cl.ResumeFetchPartitions(map[string][]int32{g.sub.topic: parts})
	g.sub.logger.Debug("Partitions assigned", g.sub.logFields.Add(watermill.LogFields{"partitions": fmt.Sprint(parts)}))
	committed, readErr := g.reads.Committed(parts)
	starts, startErrs := g.sub.initialStarts(g.sarama, parts)
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
	for _, p := range parts {
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
		c := newKgoClaim(g.sub.topic, p)
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
	first, _ := kclient.ListOffsets(g.sarama, g.sub.topic, parts, sarama.OffsetOldest)
	end, _ := kclient.ListOffsets(g.sarama, g.sub.topic, parts, sarama.OffsetNewest)
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
	g.sess.disown(parts)
	g.waitClaims(g.stopClaims(parts))
	g.sub.setPhase(ready.Joining, nil)
	go g.watchJoined(g.sess.Context())
}

// watchJoined tells Ready the member consumes once the coordinator took
// it in (a member epoch above 0), with or without partitions, as a
// classic session's start does; until ctx ends.
func (g *kgoGroup) watchJoined(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if _, epoch := g.cl.GroupMetadata(); epoch > 0 {
			g.sub.setPhase(ready.Consuming, nil)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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
		err = g.runClaim(g.sess, c, o, feed{messages: c.out, start: start, watching: c.watching})
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
	} else if starts, _ := g.sub.initialStarts(g.sarama, []int32{p}); len(starts) > 0 {
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
	next := newKgoClaim(g.sub.topic, p)
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
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return
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

// kgoReads is clusterReads for a consumer-protocol member: through the
// subscription's Sarama client, but for a partition's leader epoch, which
// franz-go's fetches find first: the newest epoch of the records fetched
// (before they are handed to the claim), or Sarama's cached metadata's
// when newer.
type kgoReads struct {
	saramaReads
	mu     sync.Mutex
	epochs map[int32]int32
}

func (r *kgoReads) sawEpoch(p int32, epoch int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if epoch > r.epochs[p] {
		r.epochs[p] = epoch
	}
}

func (r *kgoReads) LeaderEpoch(p int32) (int32, error) {
	r.mu.Lock()
	seen, ok := r.epochs[p]
	r.mu.Unlock()
	e, err := r.saramaReads.LeaderEpoch(p)
	if err != nil {
		if ok {
			return seen, nil
		}
		return e, err
	}
	return max(e, seen), nil
}

// checkConsumerProtocol fails when the cluster does not run the consumer
// group protocol (KIP-848, generally available from Kafka 4.0): franz-go
// would otherwise fall back to the classic protocol without a word, and
// the subscription would run on a protocol its config did not ask for. The
// request alone does not tell (Kafka 3.7-3.9 serve ConsumerGroupHeartbeat
// as an early access); the group.version feature does, where the cluster
// lists its finalized features.
func (sub *subscription) checkConsumerProtocol(ctx context.Context, client sarama.Client) error {
	if !sub.cfg.ConsumerProtocol || sub.cfg.ConsumerGroup == "" {
		return nil
	}
	opts, err := kgoConnection(client, sub.cfg.Brokers)()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("cannot create the consumer-protocol client: %w", err)
	}
	defer cl.Close()
	net := client.Config().Net
	ctx, cancel := context.WithTimeout(ctx, net.DialTimeout+net.ReadTimeout)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
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
