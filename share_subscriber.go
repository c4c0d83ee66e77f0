package safeack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/internal/ready"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrShareGroupsUnsupported is returned by ShareSubscriber.Subscribe when the
// cluster does not serve share groups (Kafka before 4.2, or share groups not
// enabled on the brokers).
var ErrShareGroupsUnsupported = errors.New("safeack: the cluster does not serve share groups (KIP-932: Kafka 4.2 or later, with share groups enabled)")

// ShareSubscriber consumes Kafka topics through a share group (KIP-932) and
// implements message.Subscriber and message.SubscribeInitializer.
//
// Share groups keep no order. The broker tracks every record: a member
// acquires records for a time (the acquisition lock,
// group.share.record.lock.duration.ms, 30 s by default), and acknowledges
// each one as accepted, released (delivered again, its delivery count one
// higher) or rejected (archived, never delivered again). Members of one
// share group read the same partitions at once, so a partition's work is
// spread over as many members as there are, without a completed prefix to
// hold anything back.
//
// A message's Ack accepts its record and a Nack releases it, until the
// record's delivery count reaches MaxDeliveries: then it is rejected, or
// handed to DeadLetter. Acks are sent in batches, with the next fetch or
// within AckFlushInterval, and Close sends them before it leaves; records
// handed out and not answered by then are released, so that another member
// gets them at once rather than after the acquisition lock times out. A
// record still unanswered half-way through its lock has the lock renewed
// (KIP-1222), so a long handler keeps its record.
//
// Each Subscribe call runs Members members (one kgo client each). A member
// takes up to MaxInFlight records per poll and polls again only once every
// message of the last poll is answered: the share group client accepts at
// the next poll what the last one left unanswered (Kafka's own share
// consumer has the same rule). A slow message therefore holds its member's
// next poll; more Members, or more processes, keep the work flowing.
//
// The record of a message is found with the same context helpers as a
// Subscriber's (MessagePartitionFromCtx, MessagePartitionOffsetFromCtx,
// MessageKeyFromCtx, MessageTimestampFromCtx, MessageTopicFromCtx), and its
// delivery count with MessageDeliveryCountFromCtx. Defer,
// DeferredCompletion, PoisonQueue and RejectPoison work with its messages.
//
// Delivery is at-least-once: a member that crashes, or holds a record past
// its acquisition lock, has its records delivered again to another.
type ShareSubscriber struct {
	cfg    ShareSubscriberConfig
	logger watermill.LoggerAdapter

	closing   chan struct{}
	closeOnce sync.Once
	closed    atomic.Bool
	lifecycle sync.Mutex // orders a subscription's start against Close
	subs      sync.WaitGroup

	ready ready.Tracker
	stats shareRegistry
}

var (
	_ message.Subscriber           = (*ShareSubscriber)(nil)
	_ message.SubscribeInitializer = (*ShareSubscriber)(nil)
)

// NewShareSubscriber validates config and returns a ShareSubscriber. A nil
// logger disables logging. Invalid configuration gives an error wrapping
// ErrInvalidConfig that names the field.
func NewShareSubscriber(config ShareSubscriberConfig, logger watermill.LoggerAdapter) (*ShareSubscriber, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &ShareSubscriber{
		cfg:     config.withDefaults(),
		logger:  logger.With(watermill.LogFields{"subscriber_uuid": watermill.NewShortUUID()}),
		closing: make(chan struct{}),
	}, nil
}

// shareSubscription is one Subscribe call: Members members of the share
// group, each a kgo client, sharing one output channel.
type shareSubscription struct {
	s         *ShareSubscriber
	cfg       *ShareSubscriberConfig
	topic     string
	output    chan *message.Message
	members   []*shareMember
	logger    watermill.LoggerAdapter
	logFields watermill.LogFields

	// stop ends when Close is called or Subscribe's context ends: nothing
	// more is handed out. msgCtx is the parent of the messages' contexts,
	// cancelled only once the drain is over.
	stop      context.Context
	msgCtx    context.Context
	msgCancel context.CancelFunc

	// acked is set when an ack was given since the last flush.
	acked atomic.Bool

	mu       sync.Mutex
	inFlight map[*shareDelivery]struct{}
}

// Subscribe joins the share group for topic and returns the channel its
// messages arrive on. Up to MaxInFlight messages may be unanswered at once.
// The channel closes when ctx is cancelled or the ShareSubscriber is closed,
// after the drain (see Close).
//
// Subscribe connects before it returns: it fails when no broker can be
// reached, with ErrShareGroupsUnsupported when the cluster does not serve
// share groups, and when InitialOffset is set and the group's config cannot
// be altered.
func (s *ShareSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.closed.Load() {
		return nil, ErrSubscriberClosed
	}
	if topic == "" {
		return nil, errors.New("safeack: empty topic")
	}
	sub := &shareSubscription{
		s:        s,
		cfg:      &s.cfg,
		topic:    topic,
		output:   make(chan *message.Message),
		inFlight: make(map[*shareDelivery]struct{}),
		logFields: watermill.LogFields{
			"provider":            "safeack",
			"topic":               topic,
			"share_group":         s.cfg.ShareGroup,
			"kafka_consumer_uuid": watermill.NewShortUUID(),
		},
	}
	sub.logger = s.logger.With(sub.logFields)
	sub.logger.Info("Subscribing to Kafka topic through a share group", nil)

	// stop is set before the client exists: its hooks read it.
	stop, stopCancel := context.WithCancel(ctx)
	sub.stop = stop
	sub.msgCtx, sub.msgCancel = context.WithCancel(context.WithoutCancel(ctx))
	err := sub.connect(ctx)
	s.lifecycle.Lock()
	if err == nil && s.closed.Load() {
		err = ErrSubscriberClosed
	}
	if err == nil {
		s.subs.Add(1)
	}
	s.lifecycle.Unlock()
	if err != nil {
		stopCancel()
		sub.msgCancel()
		for _, m := range sub.members {
			s.ready.Remove(m)
		}
		for _, m := range sub.members {
			m.client.Close()
		}
		if errors.Is(err, ErrSubscriberClosed) {
			return nil, err
		}
		return nil, fmt.Errorf("safeack: subscribing to %q in share group %q: %w", topic, s.cfg.ShareGroup, err)
	}
	s.stats.attach(sub)
	go func() {
		select {
		case <-s.closing:
			stopCancel()
		case <-stop.Done():
		}
	}()
	go func() {
		defer s.subs.Done()
		defer stopCancel()
		sub.run()
		for _, m := range sub.members {
			s.ready.Remove(m)
		}
		s.stats.detach(sub)
		close(sub.output)
	}()
	return sub.output, nil
}

// connect checks that the cluster serves share groups and sets the group's
// start position when asked, on a client of its own that joins no group
// (a member joining first could start the group at the old position), then
// makes the members' clients.
func (sub *shareSubscription) connect(ctx context.Context) error {
	cfg := sub.cfg
	base := []kgo.Opt{
		kgo.ClientID("safeack"),
		// A fetch in flight holds the acks given meanwhile until it
		// returns: a short wait keeps them prompt.
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.WithLogger(kgoLogger{sub.logger}),
	}
	base = append(base, cfg.ClientOptions...)
	base = append(base, kgo.SeedBrokers(cfg.Brokers...))
	admin, err := kgo.NewClient(base...)
	if err != nil {
		return fmt.Errorf("%w: ClientOptions: %w", ErrInvalidConfig, err)
	}
	defer admin.Close()
	if err := checkShareSupport(ctx, admin); err != nil {
		return err
	}
	if cfg.InitialOffset != 0 {
		if err := setShareAutoOffsetReset(ctx, admin, cfg.ShareGroup, cfg.InitialOffset); err != nil {
			return err
		}
	}
	for i := range cfg.Members {
		m := &shareMember{sub: sub, id: i}
		opts := append(slices.Clone(base),
			kgo.ShareGroup(cfg.ShareGroup),
			kgo.ConsumeTopics(sub.topic),
			// At most MaxInFlight records per fetch, and a fetch only
			// when a poll asks: records are acquired only to be handed
			// out, never to wait in a buffer (their locks running, out
			// of other members' reach) behind a batch still in work.
			kgo.ShareMaxRecords(int32(cfg.MaxInFlight)),
			kgo.ShareMaxRecordsStrict(),
			kgo.MaxConcurrentFetches(0),
			kgo.ShareAckCallback(sub.ackResults),
			kgo.WithHooks(shareReadyHook{m}),
		)
		client, err := kgo.NewClient(opts...)
		if err != nil {
			return fmt.Errorf("%w: ClientOptions: %w", ErrInvalidConfig, err)
		}
		m.client = client
		sub.members = append(sub.members, m)
		sub.s.ready.Set(m, sub.topic, cfg.ShareGroup, "share group", ready.Joining, nil)
	}
	return nil
}

// shareMember is one member of the share group: a kgo client and the loop
// that polls it.
type shareMember struct {
	sub    *shareSubscription
	id     int
	client *kgo.Client
	// coordinator is the broker that answered the last heartbeat (for
	// shareReadyHook); hasCoordinator says one did.
	coordinator    atomic.Int32
	hasCoordinator atomic.Bool
	// acks are the acknowledgements waiting for the broker's answer, for
	// a ShareDeliveryObserver.
	acks shareAckWaits
}

// CheckShareGroups reports whether the cluster at brokers serves share
// groups: nil when it does; an error wrapping ErrShareGroupsUnsupported,
// naming what is missing, when it does not (a broker before Kafka 4.2, or
// one whose share groups are not enabled: its share.version feature is not
// finalized at 1 or more, as on Kafka 4.0 and 4.1, which list the share
// requests as an early-access preview); or the error of the request. opts
// are franz-go client options for the connection (TLS, SASL), as in
// ShareSubscriberConfig.ClientOptions.
func CheckShareGroups(ctx context.Context, brokers []string, opts ...kgo.Opt) error {
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return err
	}
	defer client.Close()
	return checkShareSupport(ctx, client)
}

// checkShareSupport asks a broker which requests it serves and which
// features the cluster has finalized (see CheckShareGroups).
func checkShareSupport(ctx context.Context, client *kgo.Client) error {
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, client)
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return err
	}
	served := make(map[int16]bool, len(resp.ApiKeys))
	for _, k := range resp.ApiKeys {
		served[k.ApiKey] = true
	}
	for _, k := range []kmsg.Key{kmsg.ShareGroupHeartbeat, kmsg.ShareFetch, kmsg.ShareAcknowledge} {
		if !served[int16(k)] {
			return fmt.Errorf("%w: the broker does not serve %s", ErrShareGroupsUnsupported, kmsg.NameForKey(int16(k)))
		}
	}
	// A cluster that lists finalized features says whether share groups
	// are on; one that lists none (before KIP-584) has no preview to tell
	// apart.
	if len(resp.FinalizedFeatures) > 0 {
		level := int16(0)
		for _, f := range resp.FinalizedFeatures {
			if f.Name == "share.version" {
				level = f.MaxVersionLevel
			}
		}
		if level < 1 {
			return fmt.Errorf("%w: the cluster's share.version feature is %d (share groups not enabled; generally available from Kafka 4.2)", ErrShareGroupsUnsupported, level)
		}
	}
	return nil
}

// setShareAutoOffsetReset sets the group's share.auto.offset.reset.
func setShareAutoOffsetReset(ctx context.Context, client *kgo.Client, group string, initial int64) error {
	value := "latest"
	if initial == sarama.OffsetOldest {
		value = "earliest"
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name = "share.auto.offset.reset"
	c.Op = kmsg.IncrementalAlterConfigOpSet
	c.Value = &value
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, client)
	if err != nil {
		return fmt.Errorf("setting share.auto.offset.reset=%s on the group (InitialOffset): %w", value, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			msg := ""
			if r.ErrorMessage != nil {
				msg = ": " + *r.ErrorMessage
			}
			return fmt.Errorf("setting share.auto.offset.reset=%s on the group (InitialOffset): %w%s", value, err, msg)
		}
	}
	return nil
}

// run runs every member until the subscription stops; then it flushes the
// acks and releases and leaves.
func (sub *shareSubscription) run() {
	flushDone, flushEnded := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(flushEnded)
		sub.flushLoop(flushDone)
	}()
	var wg sync.WaitGroup
	for _, m := range sub.members {
		wg.Go(m.run)
	}
	wg.Wait()
	close(flushDone)
	<-flushEnded // no FlushAcks of its own may run beside the clients' Close
	sub.leave()
}

// run polls, hands out and waits until the poll's messages are answered
// (kgo accepts at the next poll what the last one left unanswered), until
// the subscription stops; then it drains and releases what is left.
func (m *shareMember) run() {
	sub := m.sub
	renew := time.NewTicker(renewCheck)
	defer renew.Stop()
	for sub.stop.Err() == nil {
		fetches := m.client.PollRecords(sub.stop, sub.cfg.MaxInFlight)
		if fetches.IsClientClosed() || sub.stop.Err() != nil {
			sub.releaseRecords(fetches.Records())
			break
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			sub.logger.Error("Share fetch failed", err, watermill.LogFields{"partition": p, "member": m.id})
		})
		batch := sub.take(m, fetches.Records())
		sub.handOut(batch, renew.C)
		sub.await(batch, renew.C)
	}
}

// take turns a poll's records into deliveries. Records past MaxDeliveries,
// and records the Unmarshaler rejects, are answered here and not handed
// out.
func (sub *shareSubscription) take(m *shareMember, recs []*kgo.Record) []*shareDelivery {
	batch := make([]*shareDelivery, 0, len(recs))
	for _, r := range recs {
		d := sub.newDelivery(m, r)
		if d != nil {
			batch = append(batch, d)
		}
	}
	return batch
}

// handOut sends the batch's messages, renewing meanwhile the acquisition
// locks of the batch's records that take long: a reader that takes one
// message at a time keeps the member here while it handles the last one,
// and the records not yet sent wait here too, their locks running. On
// stop, the ones not sent are released.
func (sub *shareSubscription) handOut(batch []*shareDelivery, renew <-chan time.Time) {
	now := time.Now()
	for _, d := range batch {
		// The lock runs from the broker's fetch: what is left of it now
		// is a little less than its duration, a safe span to renew by.
		if deadline := d.rec.AcquisitionDeadline(); !deadline.IsZero() {
			d.lockSpan = deadline.Sub(now)
			d.renewAt = now.Add(d.lockSpan / 2)
		}
	}
	for i, d := range batch {
		d.handedAt = time.Now()
		sub.track(d)
		if d.pastMax {
			go d.giveUp()
			continue
		}
		go d.watch()
		for sent := false; !sent; {
			select {
			case sub.output <- d.msg:
				sent = true
			case now := <-renew:
				sub.renew(batch, now)
			case <-sub.stop.Done():
				for _, rest := range batch[i:] {
					if rest != d {
						sub.track(rest)
					}
					rest.finish(kgo.AckRelease, outcomeReleasedAtClose)
				}
				return
			}
		}
	}
}

// await waits until every delivery of the batch is answered, renewing the
// acquisition locks of those that take long. On stop it waits up to
// DrainTimeout more, then releases the rest.
func (sub *shareSubscription) await(batch []*shareDelivery, renew <-chan time.Time) {
	for i := 0; i < len(batch); {
		select {
		case <-batch[i].done:
			i++
		case now := <-renew:
			sub.renew(batch[i:], now)
		case <-sub.stop.Done():
			sub.drain(batch[i:], renew)
			return
		}
	}
}

func (sub *shareSubscription) drain(batch []*shareDelivery, renew <-chan time.Time) {
	timer := time.NewTimer(sub.cfg.DrainTimeout)
	defer timer.Stop()
	for i := 0; i < len(batch); {
		select {
		case <-batch[i].done:
			i++
			continue
		case now := <-renew:
			sub.renew(batch[i:], now)
			continue
		case <-timer.C:
		}
		for _, rest := range batch[i:] {
			rest.finish(kgo.AckRelease, outcomeReleasedAtClose)
		}
		return
	}
}

// renewCheck is how often a member looks for acquisition locks to renew.
const renewCheck = 100 * time.Millisecond

// renew extends the acquisition lock (KIP-1222) of the deliveries still
// unanswered half-way through their lock, so that a long handler (or an
// unresolved Completion) keeps its record instead of seeing it delivered
// to another member.
func (sub *shareSubscription) renew(batch []*shareDelivery, now time.Time) {
	for _, d := range batch {
		if d.lockSpan <= 0 || now.Before(d.renewAt) || d.status.Load() != 0 {
			continue
		}
		d.rec.Ack(kgo.AckRenew)
		d.renewAt = now.Add(d.lockSpan / 2)
		sub.acked.Store(true) // flushed within AckFlushInterval
		sub.s.stats.update(d.ctr, func(c *ShareCounters) { c.LockRenewals++ })
	}
}

// releaseRecords releases records taken but never made deliveries.
func (sub *shareSubscription) releaseRecords(recs []*kgo.Record) {
	for _, r := range recs {
		r.Ack(kgo.AckRelease)
		sub.s.stats.count(r.Topic, r.Partition, func(c *ShareCounters) { c.Received++; c.Released++ })
	}
}

// leave sends every ack and release, cancels the messages' contexts and
// leaves the group.
func (sub *shareSubscription) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), sub.cfg.DrainTimeout+5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, m := range sub.members {
		wg.Go(func() {
			if err := m.client.FlushAcks(ctx); err != nil {
				sub.logger.Error("Flushing share acks at close", err, nil)
			}
			m.client.Close() // sends what is left and leaves the group
			m.acks.left()
		})
	}
	wg.Wait()
	sub.msgCancel()
	sub.logger.Info("Left the share group", nil)
}

// flushLoop sends the acks given since the last flush every
// AckFlushInterval.
func (sub *shareSubscription) flushLoop(done <-chan struct{}) {
	tick := time.NewTicker(sub.cfg.AckFlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if !sub.acked.Swap(false) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, m := range sub.members {
			if err := m.client.FlushAcks(ctx); err != nil {
				sub.logger.Error("Flushing share acks", err, nil)
			}
		}
		cancel()
	}
}

// ackResults counts and logs what the broker refused, and passes the
// answers on to the acknowledgements observed.
func (sub *shareSubscription) ackResults(client *kgo.Client, results kgo.ShareAckResults) {
	var m *shareMember
	for _, mm := range sub.members {
		if mm.client == client {
			m = mm
		}
	}
	for _, r := range results {
		if m != nil && r.Topic == sub.topic {
			m.acks.answered(r.Partition, r.Err)
		}
		if r.Err == nil {
			continue
		}
		sub.s.stats.count(r.Topic, r.Partition, func(c *ShareCounters) { c.AckErrors++ })
		sub.logger.Error("Share acknowledgement refused; the broker delivers the records again", r.Err, watermill.LogFields{"partition": r.Partition})
	}
}

func (sub *shareSubscription) track(d *shareDelivery) {
	sub.mu.Lock()
	sub.inFlight[d] = struct{}{}
	sub.mu.Unlock()
}

func (sub *shareSubscription) untrack(d *shareDelivery) {
	sub.mu.Lock()
	delete(sub.inFlight, d)
	sub.mu.Unlock()
}

// Close stops every subscription: nothing more is handed out, answers to
// the messages handed out are awaited up to DrainTimeout while their
// contexts stay alive, then the records still unanswered are released,
// every ack and release is sent to the broker, the members leave the
// share group, every message context is cancelled and every output channel
// is closed. Safe to call more than once.
func (s *ShareSubscriber) Close() error {
	s.closeOnce.Do(func() {
		s.lifecycle.Lock()
		s.closed.Store(true)
		s.lifecycle.Unlock()
		close(s.closing)
	})
	s.subs.Wait()
	return nil
}

// Ready reports whether every subscription is a member of its share group,
// as Subscriber.Ready does: nil when every member of every Subscribe call
// not yet ended had its last share group heartbeat answered, else an error
// wrapping ErrNotReady that says what each is doing; a member whose
// heartbeat could not be sent, or whose coordinator cannot be reached, is
// not ready until a heartbeat is answered again. The broker may hand a
// new member its partitions a heartbeat later
// (share.heartbeat.interval.ms, 5 s by default). Before the first Subscribe
// it reports ErrNotReady, after Close ErrSubscriberClosed. It does no I/O.
func (s *ShareSubscriber) Ready() error {
	if s.closed.Load() {
		return ErrSubscriberClosed
	}
	_, err := s.ready.Check()
	return err
}

// WaitReady blocks until Ready reports nil, ctx ends or the subscriber is
// closed, as Subscriber.WaitReady.
func (s *ShareSubscriber) WaitReady(ctx context.Context) error {
	for {
		if s.closed.Load() {
			return ErrSubscriberClosed
		}
		changed, err := s.ready.Check()
		if err == nil {
			return nil
		}
		select {
		case <-changed:
		case <-s.closing:
			return ErrSubscriberClosed
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		}
	}
}

// SubscribeInitialize creates topic with InitializeTopicDetails and waits
// until all its partitions have leaders.
func (s *ShareSubscriber) SubscribeInitialize(topic string) (err error) {
	if s.cfg.InitializeTopicDetails == nil {
		return errors.New("safeack: InitializeTopicDetails is empty, cannot SubscribeInitialize")
	}
	init := &Subscriber{cfg: SubscriberConfig{
		Brokers:                     s.cfg.Brokers,
		OverwriteSaramaConfig:       DefaultSaramaSubscriberConfig(),
		InitializeTopicDetails:      s.cfg.InitializeTopicDetails,
		WaitForTopicCreationTimeout: s.cfg.WaitForTopicCreationTimeout,
	}}
	return init.SubscribeInitializeWithContext(context.Background(), topic)
}

// shareReadyHook follows the share group heartbeats for Ready. A heartbeat
// read tells both ways; a heartbeat that could not be written, or a failed
// connection to the broker that answered the last one, tells that the
// member is cut off: kgo then calls no read hook at all (a reset connection
// fails the write, a refused dial fails before any write), and Ready would
// go on reporting the last answer.
type shareReadyHook struct{ m *shareMember }

var (
	_ kgo.HookBrokerRead    = shareReadyHook{}
	_ kgo.HookBrokerWrite   = shareReadyHook{}
	_ kgo.HookBrokerConnect = shareReadyHook{}
)

func (h shareReadyHook) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.ShareGroupHeartbeat) {
		return
	}
	if err == nil {
		h.m.coordinator.Store(meta.NodeID)
		h.m.hasCoordinator.Store(true)
	}
	h.set(err)
}

func (h shareReadyHook) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.ShareGroupHeartbeat) && err != nil {
		h.set(err)
	}
}

func (h shareReadyHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil && h.m.hasCoordinator.Load() && meta.NodeID == h.m.coordinator.Load() {
		h.set(err)
	}
}

func (h shareReadyHook) set(err error) {
	sub := h.m.sub
	if sub.stop.Err() != nil {
		return
	}
	p := ready.Consuming
	if err != nil {
		p = ready.Connecting
	}
	sub.s.ready.Set(h.m, sub.topic, sub.cfg.ShareGroup, "share group", p, err)
}

// kgoLogger passes kgo's warnings and errors to the Watermill logger.
type kgoLogger struct{ l watermill.LoggerAdapter }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := watermill.LogFields{}
	for i := 0; i+1 < len(keyvals); i += 2 {
		fields[fmt.Sprint(keyvals[i])] = keyvals[i+1]
	}
	if level == kgo.LogLevelError {
		k.l.Error("kgo: "+msg, nil, fields)
		return
	}
	k.l.Info("kgo: "+msg, fields)
}
