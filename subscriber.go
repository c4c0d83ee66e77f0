// Package safeack is a Watermill subscriber for Kafka that hands many
// messages of one partition to handlers at once, lets them ack in any
// order, and commits only each partition's completed prefix: the position
// before the oldest record still being processed. A crash, a rebalance or a
// Close therefore never commits past unfinished work.
//
// The guarantee is at-least-once. A committed offset means "safe to resume
// here"; records after it that were already handled may be handled again by
// the next owner of the partition, so handlers must tolerate repeats.
//
// Subscriber is a drop-in replacement for watermill-kafka v3's subscriber:
// SubscriberConfig keeps its field names and meanings, and adds bounds on
// concurrency and on what a partition may hold.
package safeack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/internal/partition"
)

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = errors.New("safeack: subscriber closed")

// Subscriber consumes Kafka topics through a Sarama consumer group and
// implements message.Subscriber and message.SubscribeInitializer.
type Subscriber struct {
	cfg    SubscriberConfig
	logger watermill.LoggerAdapter
	// commitEvery is the commit interval: Sarama's AutoCommit.Interval when
	// the caller enabled auto-commit, CommitInterval otherwise.
	commitEvery time.Duration

	closing   chan struct{}
	closeOnce sync.Once
	closed    atomic.Bool
	subs      sync.WaitGroup

	// txn makes the subscriptions commit through Kafka transactions (see
	// NewTxnPublisher); subscribed tells NewTxnPublisher it is too late.
	txn        atomic.Pointer[TxnPublisher]
	subscribed atomic.Bool

	registry registry
	ready    readiness // for Ready and WaitReady
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber validates config and returns a Subscriber. A nil logger
// disables logging. Invalid configuration gives an error wrapping
// ErrInvalidConfig that names the field.
func NewSubscriber(config SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	cfg := config.withDefaults()
	// safeack commits itself, at Sarama's auto-commit interval when
	// auto-commit is on (CommitInterval otherwise), so that a completed tail
	// is encoded just before each commit rather than on a tick of its own,
	// and so that a partition with nothing left running is committed at
	// once (see groupHandler.commitLoop). The copy is safeack's own.
	commitEvery := cfg.commitInterval()
	cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = false
	return &Subscriber{
		cfg:         cfg,
		commitEvery: commitEvery,
		logger:      logger.With(watermill.LogFields{"subscriber_uuid": watermill.NewShortUUID()}),
		closing:     make(chan struct{}),
	}, nil
}

// Subscribe starts consuming topic and returns the channel its messages
// arrive on. Up to MaxInFlight messages may be unacked at once. The channel
// closes when ctx is cancelled or the Subscriber is closed, after the
// partitions drained.
//
// Subscribe connects before it returns: it fails when no broker can be
// reached within the time the Sarama config allows (Net.DialTimeout,
// Metadata.Retry, Metadata.Timeout), or ctx ends first, and when
// TailMetadataBudget is above the group coordinator's
// offset.metadata.max.bytes. Once connected, a subscription whose
// connection fails reconnects every ReconnectRetrySleep until ctx ends or
// the Subscriber is closed; Ready tells whether it is consuming.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.closed.Load() {
		return nil, ErrSubscriberClosed
	}
	if topic == "" {
		return nil, errors.New("safeack: empty topic")
	}
	s.subscribed.Store(true)
	output := make(chan *message.Message)
	sub := &subscription{
		subscriber: s,
		cfg:        &s.cfg,
		logger:     s.logger,
		topic:      topic,
		output:     output,
		pool:       partition.NewPool(output, s.cfg.MaxInFlight),
		logFields: watermill.LogFields{
			"provider":            "safeack",
			"topic":               topic,
			"consumer_group":      s.cfg.ConsumerGroup,
			"kafka_consumer_uuid": watermill.NewShortUUID(),
		},
	}
	sub.workerCfg = s.cfg.workerConfig(s.logger, sub.logFields)
	s.logger.Info("Subscribing to Kafka topic", sub.logFields)
	if pub := s.txn.Load(); pub != nil {
		if err := sub.startTxn(pub); err != nil {
			return nil, err
		}
	}

	// The first connection is made here, so that a cluster that cannot be
	// reached is an error, not a silent retry loop.
	client, err := sub.connect(ctx)
	if err == nil {
		err = sub.checkTailBudget(client)
	}
	if err == nil && s.closed.Load() {
		err = ErrSubscriberClosed
	}
	if err != nil {
		if client != nil {
			_ = client.Close()
		}
		if sub.txn != nil {
			sub.txn.close()
		}
		if errors.Is(err, ErrSubscriberClosed) || errors.Is(err, ErrInvalidConfig) {
			return nil, err
		}
		return nil, fmt.Errorf("safeack: subscribing to %q: %w", topic, err)
	}

	if s.cfg.ConsumerGroup == "" {
		s.ready.set(sub, phaseConsuming, nil)
	} else {
		s.ready.set(sub, phaseJoining, nil)
	}
	s.subs.Add(1)
	go func() {
		defer s.subs.Done()
		sub.run(ctx, client)
		if sub.txn != nil {
			sub.txn.close()
		}
		s.ready.remove(sub)
		close(sub.output)
	}()
	return sub.output, nil
}

// Close stops every subscription: partitions stop handing out messages,
// acks of the messages handed out are awaited up to DrainTimeout while
// their contexts stay alive (a handler that finishes in time has its ack
// committed), then the contexts of messages still unanswered are
// cancelled, the final completed prefixes are committed, the group is left
// and every output channel is closed. When Close returns, every message
// context is cancelled. It is safe to call more than once and
// concurrently with acks. A JoinGroup request already in flight cannot be
// interrupted (Sarama does not cancel it), so Close can wait up to the
// client's Net.ReadTimeout when it lands mid-rebalance.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.closing)
	})
	s.subs.Wait()
	return nil
}

// subscription is one Subscribe call: one output channel, one in-flight
// budget, one consumer (group) connection at a time.
type subscription struct {
	subscriber *Subscriber
	cfg        *SubscriberConfig
	logger     watermill.LoggerAdapter
	topic      string
	output     chan *message.Message
	// pool is the output and the MaxInFlight tokens the subscription's
	// partition workers share; workerCfg is their configuration.
	pool      *partition.Pool
	workerCfg partition.Config
	logFields watermill.LogFields
	// txn is where completed offsets go in transactional mode (with the
	// outputs of acked deliveries); nil: the group session's marks.
	txn *txnCommitter
}

// newWorker returns the worker of one assigned partition. Its context,
// and its messages' contexts, derive from parent.
func (sub *subscription) newWorker(parent context.Context, a partition.Assignment) (*partition.Worker, error) {
	return partition.New(parent, &sub.workerCfg, sub.pool, a)
}

func (sub *subscription) retrySleep() time.Duration {
	if d := sub.cfg.ReconnectRetrySleep; d > 0 {
		return d
	}
	return 0
}

// run consumes until ctx ends or the Subscriber closes, reconnecting after
// errors as watermill-kafka does. client is the first connection, made by
// Subscribe.
func (sub *subscription) run(ctx context.Context, client sarama.Client) {
	for {
		if client == nil {
			c, err := sub.connect(ctx)
			if err != nil {
				if sub.stopping(ctx) {
					return
				}
				sub.logger.Error("Cannot connect to Kafka; retrying", err, sub.logFields)
				sub.subscriber.ready.set(sub, phaseConnecting, err)
				if !sub.pause(ctx) {
					return
				}
				continue
			}
			client = c
		}
		if sub.cfg.ConsumerGroup == "" {
			sub.subscriber.ready.set(sub, phaseConsuming, nil)
		} else {
			sub.subscriber.ready.set(sub, phaseJoining, nil)
		}
		err := sub.consumeOnce(ctx, client)
		client = nil
		if sub.stopping(ctx) {
			return
		}
		if err != nil {
			sub.logger.Error("Consumer stopped; reconnecting", err, sub.logFields)
		} else {
			sub.logger.Info("Consumer stopped; reconnecting", sub.logFields)
		}
		sub.subscriber.ready.set(sub, phaseConnecting, err)
		if !sub.pause(ctx) {
			return
		}
	}
}

// pause waits ReconnectRetrySleep before a reconnect. It reports false
// when ctx ended or the Subscriber closed meanwhile.
func (sub *subscription) pause(ctx context.Context) bool {
	d := sub.retrySleep()
	if d <= 0 {
		return !sub.stopping(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-sub.subscriber.closing:
		return false
	}
}

func (sub *subscription) stopping(ctx context.Context) bool {
	select {
	case <-sub.subscriber.closing:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// consumeOnce runs one client connection until it fails or is stopped,
// and closes the client.
func (sub *subscription) consumeOnce(parent context.Context, client sarama.Client) error {
	defer func() {
		if err := client.Close(); err != nil && !errors.Is(err, sarama.ErrClosedClient) {
			sub.logger.Error("Cannot close Sarama client", err, sub.logFields)
		}
	}()

	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	go func() {
		select {
		case <-sub.subscriber.closing:
			cancel()
		case <-ctx.Done():
		}
	}()

	if sub.cfg.ConsumerGroup == "" {
		return sub.consumePartitions(ctx, client)
	}
	return sub.consumeGroup(ctx, client)
}

func (sub *subscription) consumeGroup(ctx context.Context, client sarama.Client) error {
	group, err := sarama.NewConsumerGroupFromClient(sub.cfg.ConsumerGroup, client)
	if err != nil {
		return fmt.Errorf("cannot create consumer group: %w", err)
	}
	errsDone := make(chan struct{})
	go func() {
		defer close(errsDone)
		for err := range group.Errors() {
			sub.logger.Error("Sarama consumer group error", err, sub.logFields)
		}
	}()
	defer func() {
		if err := group.Close(); err != nil {
			sub.logger.Info("Consumer group closed with error", sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		}
		<-errsDone
	}()

	var handler sarama.ConsumerGroupHandler = &groupHandler{sub: sub, ctx: ctx, client: client, group: group, txn: sub.txn}
	if sub.cfg.Tracer != nil {
		handler = sub.cfg.Tracer.WrapConsumerGroupHandler(handler)
	}
	var rejoin rejoinRetry
	for ctx.Err() == nil {
		// Consume returns at every rebalance; calling it again rejoins.
		err := group.Consume(ctx, []string{sub.topic}, handler)
		if err == nil {
			rejoin.reset()
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
		sub.logger.Info("Cannot rejoin the consumer group; retrying with the same member", sub.logFields.Add(watermill.LogFields{
			"err": err.Error(), "retry_in": wait.String(), "failures": rejoin.failures,
		}))
		sub.subscriber.ready.set(sub, phaseConnecting, err)
		if !sleepCtx(ctx, wait) {
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
	txn    *txnCommitter // nil: offsets are committed through the session

	// Per session, set in Setup and read by the claims it starts.
	committed map[int32]committedOffset
	// pinned closes once the commit of the session's pinned starts
	// returned (see pinStarts).
	pinned  <-chan struct{}
	mu      sync.Mutex
	workers map[int32]*partition.Worker
	stop    chan struct{}
	done    chan struct{}
	soon    chan struct{} // capacity 1: a partition asks for a commit now
}

// Setup reads the committed offsets and metadata of the claimed partitions
// (one OffsetFetch per session), pins the start of those without a commit
// (see pinStarts) and starts the session's commit loop.
func (h *groupHandler) Setup(sess sarama.ConsumerGroupSession) error {
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
		starts, startErrs = listOffsets(h.client, h.sub.topic, claimed, h.sub.cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial)
	})
	committed, err := fetchCommitted(h.client, h.sub.cfg.ConsumerGroup, h.sub.topic, claimed)
	listing.Wait()
	if err != nil && h.txn != nil {
		// Handling a committed tail's records again would write their
		// outputs twice: try the session again. Sarama runs Cleanup.
		h.mu.Lock()
		h.pinned = closedChan
		h.mu.Unlock()
		h.stop, h.done = make(chan struct{}), make(chan struct{})
		close(h.done)
		return fmt.Errorf("safeack: reading committed offsets for a transactional session: %w", err)
	}
	var pinned <-chan struct{} = closedChan
	if err != nil {
		// Without the tail every record after the committed offset is
		// redelivered: more repeats, nothing lost. Partitions without a
		// commit start at their first record (fixStart).
		h.sub.logger.Error("Cannot read committed offsets; completed tails are not skipped this session", err, h.sub.logFields)
		committed = nil
	} else {
		pinned = h.pinStarts(sess, claimed, committed, starts, startErrs)
	}
	if h.sub.cfg.DisableCompletedTail {
		committed = nil
	}
	h.mu.Lock()
	h.committed = committed
	h.pinned = pinned
	h.workers = make(map[int32]*partition.Worker, len(claimed))
	h.mu.Unlock()
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	h.soon = make(chan struct{}, 1)
	if h.txn != nil {
		h.txn.beginSession(sess, committed, h.endAssignments)
		go h.txnCommitLoop(h.stop, h.done)
	} else {
		go h.commitLoop(sess, h.stop, h.done, h.soon)
	}
	h.sub.subscriber.ready.set(h.sub, phaseConsuming, nil)
	return nil
}

// closedChan is a channel that is always closed.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

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
// the returned channel closes once it returned. ConsumeClaim hands nothing
// out before that.
func (h *groupHandler) pinStarts(sess sarama.ConsumerGroupSession, claimed []int32, committed map[int32]committedOffset,
	starts map[int32]int64, startErrs map[int32]error) <-chan struct{} {
	pinned := 0
	for _, p := range claimed {
		if c, ok := committed[p]; !ok || c.offset >= 0 {
			continue
		}
		start, ok := starts[p]
		if !ok {
			fields := watermill.LogFields{"kafka_partition": p}
			if err := startErrs[p]; err != nil {
				fields["err"] = err.Error()
			}
			h.sub.logger.Debug("Cannot resolve the start offset; the partition starts at its first record",
				h.sub.logFields.Add(fields))
			continue
		}
		sess.MarkOffset(h.sub.topic, p, start, "")
		committed[p] = committedOffset{offset: start}
		pinned++
	}
	if pinned == 0 {
		return closedChan
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sess.Commit()
		h.sub.logger.Debug("Committed the start of partitions without a commit",
			h.sub.logFields.Add(watermill.LogFields{"partitions": pinned}))
	}()
	return done
}

// commitSoon asks the commit loop to commit without waiting for the next
// interval. It never blocks.
func (h *groupHandler) commitSoon() {
	select {
	case h.soon <- struct{}{}:
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
// for a commit at once (commitSoon), within earlyCommitGap.
func (h *groupHandler) commitLoop(sess sarama.ConsumerGroupSession, stop, done, soon chan struct{}) {
	defer close(done)
	interval := h.sub.subscriber.commitEvery
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
		sent := h.markedOffsets()
		sess.Commit()
		last = time.Now()
		if h.confirm(sent) && retries < maxEarlyCommitRetries {
			retries++
			later(gap)
			return
		}
		retries = 0
	}
	for {
		select {
		case <-t.C:
			h.markTails()
			sess.Commit()
			last = time.Now()
			h.confirm(nil)
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
		}
	}
}

// maxEarlyCommitRetries bounds the early commits repeated because the
// broker did not take the previous one; after that the next interval's
// commit tries again.
const maxEarlyCommitRetries = 3

// markedOffsets returns the offset each of the session's partitions last
// handed to Sarama.
func (h *groupHandler) markedOffsets() map[int32]int64 {
	h.mu.Lock()
	workers := make([]*partition.Worker, 0, len(h.workers))
	for _, w := range h.workers {
		workers = append(workers, w)
	}
	h.mu.Unlock()
	out := make(map[int32]int64, len(workers))
	for _, w := range workers {
		out[w.Partition()] = w.Marked()
	}
	return out
}

// markTails marks every partition's completed prefix with its tail.
func (h *groupHandler) markTails() {
	h.mu.Lock()
	workers := make([]*partition.Worker, 0, len(h.workers))
	for _, w := range h.workers {
		workers = append(workers, w)
	}
	h.mu.Unlock()
	for _, w := range workers {
		w.MarkTail()
	}
}

// confirm reads the committed offsets of this session's partitions.
// It reports whether any partition of sent (offsets handed to Sarama
// before a commit) is still committed below it: that commit failed.
func (h *groupHandler) confirm(sent map[int32]int64) (behind bool) {
	h.mu.Lock()
	parts := make([]int32, 0, len(h.workers))
	for p := range h.workers {
		parts = append(parts, p)
	}
	h.mu.Unlock()
	committed, err := fetchCommitted(h.client, h.sub.cfg.ConsumerGroup, h.sub.topic, parts)
	if err != nil {
		h.sub.logger.Debug("Cannot read back committed offsets", h.sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		return len(sent) > 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, c := range committed {
		if w := h.workers[p]; w != nil {
			w.SetConfirmed(c.offset)
		}
		if off, ok := sent[p]; ok && c.offset < off {
			behind = true
		}
	}
	return behind
}

// committedOffset returns what Setup read for partition. A cooperative
// rebalance can add a claim to a running session without a new Setup; such
// a partition is read on its own.
func (h *groupHandler) committedOffset(partition int32) (committedOffset, bool) {
	if h.sub.cfg.DisableCompletedTail {
		return committedOffset{}, false
	}
	h.mu.Lock()
	c, ok := h.committed[partition]
	h.mu.Unlock()
	if ok {
		return c, true
	}
	fetched, err := fetchCommitted(h.client, h.sub.cfg.ConsumerGroup, h.sub.topic, []int32{partition})
	if err != nil {
		h.sub.logger.Error("Cannot read committed metadata; the completed tail is not skipped", err,
			h.sub.logFields.Add(watermill.LogFields{"kafka_partition": partition}))
		return committedOffset{}, false
	}
	c, ok = fetched[partition]
	return c, ok
}

// Cleanup stops the commit loop and commits what the claims marked.
func (h *groupHandler) Cleanup(sess sarama.ConsumerGroupSession) error {
	h.sub.subscriber.ready.set(h.sub, phaseJoining, nil) // the session is over: rejoining, or stopping
	close(h.stop)
	<-h.done
	h.mu.Lock()
	pinned := h.pinned
	h.mu.Unlock()
	<-pinned
	if h.txn != nil {
		h.txn.finishSession()
		return nil
	}
	sess.Commit()
	return nil
}

// ConsumeClaim runs one partition until it is revoked.
func (h *groupHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	// Nothing is taken from the claim, handed out or shown in Stats before
	// the session's pinned starts are committed; Sarama made the claim
	// (resolving its start, starting its fetch) meanwhile.
	h.mu.Lock()
	pinned := h.pinned
	h.mu.Unlock()
	<-pinned
	start := h.startOf(claim)
	// Where completed offsets go: the session's marks, or the transaction.
	a := partition.Assignment{
		Topic:         claim.Topic(),
		Partition:     claim.Partition(),
		Start:         start,
		Marker:        sess,
		Pauser:        h.group,
		HighWaterMark: claim.HighWaterMarkOffset,
		RequestCommit: h.commitSoon,
	}
	var tm *txnMarker
	if h.txn != nil {
		tm = h.txn.newMarker()
		a.Marker, a.Deliveries = tm, tm
	}
	w, err := h.sub.newWorker(sess.Context(), a)
	if err != nil {
		return err
	}
	if tm != nil {
		tm.bind(w)
	}
	if c, ok := h.committedOffset(claim.Partition()); ok {
		w.StartFromCommit(c.offset, c.metadata)
	}
	h.mu.Lock()
	h.workers[claim.Partition()] = w
	h.mu.Unlock()
	h.sub.subscriber.registry.attach(w)
	defer func() {
		h.sub.subscriber.registry.detach(w)
		h.mu.Lock()
		delete(h.workers, claim.Partition())
		h.mu.Unlock()
	}()
	w.Run(claim.Messages(), h.sub.subscriber.closing)
	return nil
}

// startOf tells where a claim starts. InitialOffset is the committed
// offset when Sarama fetches from it; it is the Consumer.Offsets.Initial
// sentinel when the group has no commit, or when its commit was out of range
// and Sarama fell back (Consumer.Group.ResetInvalidOffsets). Sarama does not
// expose the offset it then resolved, so the first record fixes the start
// (see fixStart) and, until one arrives, Stats shows the broker's current
// answer for the sentinel.
func (h *groupHandler) startOf(claim sarama.ConsumerGroupClaim) partition.Start {
	if off := claim.InitialOffset(); off >= 0 {
		return partition.Start{Offset: off, Resolved: true}
	}
	estimate, err := h.client.GetOffset(claim.Topic(), claim.Partition(), claim.InitialOffset())
	if err != nil {
		h.sub.logger.Debug("Cannot read the partition's start offset; Stats shows 0 until the first record",
			h.sub.logFields.Add(watermill.LogFields{"kafka_partition": claim.Partition(), "err": err.Error()}))
		estimate = 0
	}
	return partition.Start{Offset: estimate}
}

// resolveStart resolves Consumer.Offsets.Initial of a partition to an offset
// and starts consuming there, so that the bookkeeping starts exactly where
// fetching does. Retention can move the log start between the two calls; the
// resolution is then retried.
func (sub *subscription) resolveStart(client sarama.Client, consumer sarama.Consumer, partition int32) (sarama.PartitionConsumer, int64, error) {
	initial := sub.cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var start int64
		start, err = client.GetOffset(sub.topic, partition, initial)
		if err != nil {
			return nil, 0, fmt.Errorf("cannot resolve the start offset of partition %d: %w", partition, err)
		}
		var pc sarama.PartitionConsumer
		pc, err = consumer.ConsumePartition(sub.topic, partition, start)
		if err == nil {
			return pc, start, nil
		}
		if !errors.Is(err, sarama.ErrOffsetOutOfRange) {
			break
		}
	}
	return nil, 0, fmt.Errorf("cannot consume partition %d: %w", partition, err)
}

// consumePartitions reads every partition of the topic without a group:
// nothing is committed.
func (sub *subscription) consumePartitions(ctx context.Context, client sarama.Client) error {
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("cannot create consumer: %w", err)
	}
	if sub.cfg.Tracer != nil {
		consumer = sub.cfg.Tracer.WrapConsumer(consumer)
	}
	defer consumer.Close()
	partitions, err := consumer.Partitions(sub.topic)
	if err != nil {
		return fmt.Errorf("cannot list partitions of %q: %w", sub.topic, err)
	}
	var wg sync.WaitGroup
	failed := make(chan error, len(partitions))
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, p := range partitions {
		pc, start, err := sub.resolveStart(client, consumer, p)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		if sub.cfg.Tracer != nil {
			pc = sub.cfg.Tracer.WrapPartitionConsumer(pc)
		}
		w, err := sub.newWorker(pctx, partition.Assignment{
			Topic:         sub.topic,
			Partition:     p,
			Start:         partition.Start{Offset: start, Resolved: true},
			Pauser:        consumer,
			HighWaterMark: pc.HighWaterMarkOffset,
		})
		if err != nil {
			pc.Close()
			cancel()
			wg.Wait()
			return err
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			for err := range pc.Errors() {
				sub.logger.Error("Partition consumer error", err, w.LogFields())
			}
		}()
		go func() {
			defer wg.Done()
			sub.subscriber.registry.attach(w)
			defer sub.subscriber.registry.detach(w)
			w.Run(pc.Messages(), sub.subscriber.closing)
			if err := pc.Close(); err != nil {
				failed <- err
			}
			cancel() // one partition ending ends this connection
		}()
	}
	wg.Wait()
	close(failed)
	return errors.Join(collect(failed)...)
}

func collect(ch <-chan error) []error {
	var errs []error
	for err := range ch {
		errs = append(errs, err)
	}
	return errs
}

// SubscribeInitialize creates topic with InitializeTopicDetails and, unless
// DoNotWaitForTopicCreation, waits until all its partitions have leaders.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	return s.SubscribeInitializeWithContext(context.Background(), topic)
}

// SubscribeInitializeWithContext is SubscribeInitialize bounded by ctx.
func (s *Subscriber) SubscribeInitializeWithContext(ctx context.Context, topic string) (err error) {
	if s.cfg.InitializeTopicDetails == nil {
		return errors.New("safeack: InitializeTopicDetails is empty, cannot SubscribeInitialize")
	}
	admin, err := sarama.NewClusterAdmin(s.cfg.Brokers, s.cfg.OverwriteSaramaConfig)
	if err != nil {
		return fmt.Errorf("cannot create cluster admin: %w", err)
	}
	defer func() { err = errors.Join(err, admin.Close()) }()

	if err := admin.CreateTopic(topic, s.cfg.InitializeTopicDetails, false); err != nil &&
		!errors.Is(err, sarama.ErrTopicAlreadyExists) && !strings.Contains(err.Error(), "already exists") {
		return fmt.Errorf("cannot create topic %q: %w", topic, err)
	}
	if s.cfg.DoNotWaitForTopicCreation {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WaitForTopicCreationTimeout)
	defer cancel()
	return waitForTopic(ctx, admin, topic, s.cfg.InitializeTopicDetails.NumPartitions)
}

func waitForTopic(ctx context.Context, admin sarama.ClusterAdmin, topic string, partitions int32) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		md, err := admin.DescribeTopics([]string{topic})
		if err == nil && len(md) == 1 && md[0].Err == sarama.ErrNoError && topicReady(md[0], partitions) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %q not ready: %w", topic, ctx.Err())
		case <-tick.C:
		}
	}
}

func topicReady(md *sarama.TopicMetadata, want int32) bool {
	if want > 0 && int32(len(md.Partitions)) < want {
		return false
	}
	if len(md.Partitions) == 0 {
		return false
	}
	for _, p := range md.Partitions {
		if p.Err != sarama.ErrNoError || p.Leader < 0 {
			return false
		}
	}
	return true
}
