package share

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
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/ready"
	"github.com/safeack/safeack/internal/sentinel"
)

// Subscription is one Subscribe call: Members members of the share group,
// each a kgo client, sharing one output channel and MaxInFlight handlers.
type Subscription struct {
	host      Host
	stats     *Registry
	cfg       *Options
	topic     string
	output    chan *message.Message
	members   []*member
	logger    watermill.LoggerAdapter
	logFields watermill.LogFields

	// stop ends when the host closes or Subscribe's context ends: nothing
	// more is handed out. msgCtx is the parent of the messages' contexts,
	// cancelled only once the drain is over.
	stop       context.Context
	stopCancel context.CancelFunc
	msgCtx     context.Context
	msgCancel  context.CancelFunc

	// acked is set when an ack was given since the last flush;
	// releasedStopping once a record was released after the stop (see
	// leave).
	acked, releasedStopping atomic.Bool

	// handlers holds a token for each message handed out and not yet
	// answered by the router: MaxInFlight in all, shared by the members,
	// so that one member's records go to the handlers another member's
	// leave free while that member waits for its poll.
	handlers chan struct{}

	mu       sync.Mutex
	inFlight map[*Delivery]struct{}
}

// Start connects a subscription to topic: it checks that the cluster
// serves share groups, sets the group's start position when asked and
// makes the members' clients. Run starts it; Abort undoes it.
func Start(ctx context.Context, cfg *Options, host Host, topic string) (*Subscription, error) {
	sub := &Subscription{
		host:     host,
		stats:    host.Registry(),
		cfg:      cfg,
		topic:    topic,
		output:   make(chan *message.Message),
		handlers: make(chan struct{}, cfg.MaxInFlight),
		inFlight: make(map[*Delivery]struct{}),
		logFields: watermill.LogFields{
			"provider":            "safeack",
			"topic":               topic,
			"share_group":         cfg.ShareGroup,
			"kafka_consumer_uuid": watermill.NewShortUUID(),
		},
	}
	sub.logger = cfg.Logger.With(sub.logFields)
	sub.logger.Info("Subscribing to Kafka topic through a share group", nil)

	// stop is set before the client exists: its hooks read it.
	sub.stop, sub.stopCancel = context.WithCancel(ctx)
	sub.msgCtx, sub.msgCancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := sub.connect(ctx); err != nil {
		sub.Abort()
		return nil, fmt.Errorf("safeack: subscribing to %q in share group %q: %w", topic, cfg.ShareGroup, err)
	}
	return sub, nil
}

// Abort undoes Start, for a subscription that does not run.
func (sub *Subscription) Abort() {
	sub.stopCancel()
	sub.msgCancel()
	for _, m := range sub.members {
		sub.host.Ended(m)
	}
	for _, m := range sub.members {
		m.client.Close()
	}
}

// Output is the channel the subscription's messages arrive on.
func (sub *Subscription) Output() <-chan *message.Message { return sub.output }

// Run runs the subscription in the background until the host closes or
// Subscribe's context ends; once it is over (the drain, the acks sent,
// the members gone, the output closed), it calls done.
func (sub *Subscription) Run(done func()) {
	sub.stats.attach(sub)
	go func() {
		select {
		case <-sub.host.Closing():
			sub.stopCancel()
		case <-sub.stop.Done():
		}
	}()
	go func() {
		defer done()
		defer sub.stopCancel()
		sub.run()
		for _, m := range sub.members {
			sub.host.Ended(m)
		}
		sub.stats.detach(sub)
		close(sub.output)
	}()
}

// connect checks that the cluster serves share groups and sets the group's
// start position when asked, on a client of its own that joins no group
// (a member joining first could start the group at the old position), then
// makes the members' clients.
func (sub *Subscription) connect(ctx context.Context) error {
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
		return fmt.Errorf("%w: ClientOptions: %w", sentinel.ErrInvalidConfig, err)
	}
	defer admin.Close()
	if err := checkSupport(ctx, admin); err != nil {
		return err
	}
	if err := checkAccess(ctx, admin, cfg.ShareGroup, sub.topic); err != nil {
		return err
	}
	if cfg.InitialOffset != 0 {
		if err := setShareAutoOffsetReset(ctx, admin, cfg.ShareGroup, cfg.InitialOffset); err != nil {
			return err
		}
	}
	for i := range cfg.Members {
		m := &member{sub: sub, id: i}
		opts := append(slices.Clone(base),
			kgo.ShareGroup(cfg.ShareGroup),
			kgo.ConsumeTopics(sub.topic),
			// A fetch only when a poll asks, and all it brought taken
			// by the poll (see run): no record waits in kgo's buffer,
			// where no lock is renewed, and none is acquired beyond
			// what the member took. At most MaxPollRecords records per
			// fetch, unless whole batches were asked for: the broker
			// then returns as many as its stored batches hold.
			kgo.ShareMaxRecords(int32(cfg.MaxPollRecords)),
			kgo.MaxConcurrentFetches(0),
			kgo.ShareAckCallback(sub.ackResults),
			kgo.WithHooks(readyHook{m}, fetchHook{m}),
		)
		if !cfg.WholeBatches {
			opts = append(opts, kgo.ShareMaxRecordsStrict())
		}
		client, err := kgo.NewClient(opts...)
		if err != nil {
			return fmt.Errorf("%w: ClientOptions: %w", sentinel.ErrInvalidConfig, err)
		}
		m.client = client
		sub.members = append(sub.members, m)
		sub.host.SetPhase(m, sub.topic, ready.Joining, nil)
	}
	return nil
}

// member is one member of the share group: a kgo client and the loop
// that polls it.
type member struct {
	sub    *Subscription
	id     int
	client *kgo.Client
	// coordinator is the broker that answered the last heartbeat (for
	// readyHook); hasCoordinator says one did.
	coordinator    atomic.Int32
	hasCoordinator atomic.Bool
	// acks are the acknowledgements waiting for the broker's answer, for
	// a ShareDeliveryObserver.
	acks ackWaits
	// renewals are the lock renewals waiting for the broker's answer.
	renewals renewalWaits
	// refusal is the authorization error of the member's last poll, nil
	// once a poll comes back without one: Ready reports it whatever the
	// heartbeats (whose refusals readyHook cannot see) say.
	refusal atomic.Pointer[error]
	// The member's share fetches (see fetchHook), under sentMu: sent holds
	// when the fetch in flight to each broker was written (a client has
	// one at most: it fetches when polled, and as a poll returns; see
	// member.buffer), answered when each
	// broker's last fetch answered since the member's last poll returned
	// was (unix nanoseconds).
	sentMu   sync.Mutex
	sent     map[int32]int64
	answered map[int32]int64
	// buffered are the records kgo buffered for the member's next poll
	// (under bufferedMu; see member.buffer).
	bufferedMu sync.Mutex
	buffered   []bufferedRecord
	// early are the records handed out before a poll returned them
	// (takeEarly; the member's goroutine only).
	early map[*kgo.Record]struct{}
	// assign follows whether the member holds partitions (assignment.go).
	assign assignWait
}

// CheckGroups is safeack.CheckShareGroups: whether the cluster at brokers
// serves share groups.
func CheckGroups(ctx context.Context, brokers []string, opts ...kgo.Opt) error {
	client, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return err
	}
	defer client.Close()
	return checkSupport(ctx, client)
}

// checkSupport asks a broker which requests it serves and which
// features the cluster has finalized (see CheckGroups).
func checkSupport(ctx context.Context, client *kgo.Client) error {
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
			return fmt.Errorf("%w: the broker does not serve %s", sentinel.ErrShareGroupsUnsupported, kmsg.NameForKey(int16(k)))
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
			return fmt.Errorf("%w: the cluster's share.version feature is %d (share groups not enabled; generally available from Kafka 4.2)", sentinel.ErrShareGroupsUnsupported, level)
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
func (sub *Subscription) run() {
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
func (m *member) run() {
	sub := m.sub
	renew := time.NewTicker(renewCheck)
	defer renew.Stop()
	for sub.stop.Err() == nil {
		pollStart := time.Now()
		fetches := m.client.PollRecords(sub.stop, -1) // all a fetch brought (see connect)
		fetched := m.fetchedFrom(pollStart)
		if fetches.IsClientClosed() || sub.stop.Err() != nil {
			sub.releaseRecords(fetches.Records())
			break
		}
		var refusal error
		fetches.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			if r := sub.authorizationError(err); r != nil {
				refusal, err = r, r
			}
			sub.logger.Error("Share fetch failed", err, watermill.LogFields{"partition": p, "member": m.id})
		})
		if refusal != nil {
			// It lasts until an ACL changes: Ready tells it.
			m.refusal.Store(&refusal)
			sub.host.SetPhase(m, sub.topic, ready.Connecting, refusal)
		} else if m.refusal.Swap(nil) != nil {
			p, err := m.phase(nil)
			sub.host.SetPhase(m, sub.topic, p, err)
		}
		batch := sub.take(m, fetches.Records(), fetched, renew.C)
		sub.handOut(m, batch, nil, renew.C)
		sub.await(m, batch, renew.C)
	}
}

// take turns a poll's records into deliveries. Records past
// MaxDeliveries without a DeadLetter, and records the Unmarshaler rejects
// without an OnUnmarshalError, are answered here and not handed out. The
// poll's locks are renewed meanwhile: a slow Unmarshaler holds the rest
// of the poll.
func (sub *Subscription) take(m *member, recs []*kgo.Record, fetched time.Time, renew <-chan time.Time) []*Delivery {
	polled := time.Now()
	buffered := m.takeBuffered(fetched)
	all := make([]*Delivery, 0, len(recs))
	for _, r := range recs {
		if _, ok := m.early[r]; ok {
			delete(m.early, r) // handed out while it waited (takeEarly), and answered
			continue
		}
		// The poll returns what kgo buffered, in order; kgo may have
		// left a record out (a partition no longer the member's).
		for len(buffered) > 0 && buffered[0].rec != r {
			buffered = buffered[1:]
		}
		var d *Delivery
		if len(buffered) > 0 {
			d, buffered = buffered[0], buffered[1:]
		} else {
			d = sub.newDelivery(m, r, fetched, polled)
		}
		all = append(all, d)
	}
	return sub.prepareAll(m, all, nil, renew)
}

// prepareAll counts the deliveries as received and prepares them (see
// prepare), renewing meanwhile their locks and those of held; it returns
// those to hand out.
func (sub *Subscription) prepareAll(m *member, all, held []*Delivery, renew <-chan time.Time) []*Delivery {
	batch := make([]*Delivery, 0, len(all))
	for _, d := range all {
		sub.received(d)
	}
	for _, d := range all {
		select {
		case now := <-renew:
			sub.renewHeld(m, now, all, held)
		default:
		}
		if sub.prepare(d) {
			batch = append(batch, d)
		}
	}
	return batch
}

// takeEarly hands out the records kgo buffered while the member waits for
// its poll's messages to be answered (see member.buffer), as handlers free
// up, instead of leaving them until the member's next poll: that poll
// waits for the member's slowest handler. It cannot poll them sooner: a
// poll accepts every record of the previous one still unanswered. It
// returns the deliveries handed out, for the member to wait for as for its
// poll's (the poll that returns them from kgo's buffer skips them, see
// take); held are the poll's deliveries still unanswered, renewed
// meanwhile.
func (sub *Subscription) takeEarly(m *member, held []*Delivery, renew <-chan time.Time) []*Delivery {
	waiting := m.takeBuffered(m.lastFetchSent(time.Now()))
	if len(waiting) == 0 {
		return nil
	}
	if m.early == nil {
		m.early = make(map[*kgo.Record]struct{})
	}
	for _, d := range waiting {
		m.early[d.rec] = struct{}{}
	}
	batch := sub.prepareAll(m, waiting, held, renew)
	sub.handOut(m, batch, held, renew)
	return batch
}

// handOut sends the batch's messages, each once a handler is free (see
// Subscription.handlers), renewing meanwhile the acquisition locks of the
// batch's records that take long: the records not yet sent wait here while
// the handlers work on earlier ones, their locks running. A record whose
// lock ends (or is about to) before it is sent is released, never handed
// out: the broker may have given it to another member. On stop, the ones
// not sent are released.
func (sub *Subscription) handOut(m *member, batch, held []*Delivery, renew <-chan time.Time) {
	// The margin leaves a renewal the time to reach the broker.
	margin := renewCheck + sub.cfg.AckFlushInterval
	for i, d := range batch {
		if d.expired(time.Now(), margin) {
			d.finish(kgo.AckRelease, LockExpired)
			continue
		}
		if d.unmarshalErr != nil {
			sub.track(d)
			go d.unmarshalFailed()
			continue
		}
		if d.pastMax {
			sub.track(d)
			go d.giveUp()
			continue
		}
		if !sub.send(m, d, batch, held, renew, margin) {
			if sub.stop.Err() == nil {
				continue // its lock ended first
			}
			for _, rest := range batch[i:] {
				rest.finish(kgo.AckRelease, ReleasedAtClose)
			}
			return
		}
	}
}

// send hands d's message out once a handler is free. It reports false
// when it did not: d's lock ended first (d released) or the subscription
// stopped (d left to the caller).
func (sub *Subscription) send(m *member, d *Delivery, batch, held []*Delivery, renew <-chan time.Time, margin time.Duration) bool {
	var out chan<- *message.Message // nil until a handler is free
	handlers := sub.handlers
	for {
		select {
		case handlers <- struct{}{}:
			handlers, out = nil, sub.output
			sub.track(d) // counted in flight from now; the handler may read handedAt
		case out <- d.msg:
			go d.watch()
			return true
		case now := <-renew:
			sub.renewHeld(m, now, batch, held)
			if d.expired(now, margin) {
				if out != nil {
					<-sub.handlers
				}
				d.finish(kgo.AckRelease, LockExpired)
				return false
			}
		case <-sub.stop.Done():
			if out != nil {
				<-sub.handlers
			}
			return false
		}
	}
}

// await waits until every delivery of the batch is answered, renewing the
// acquisition locks of those that take long. On stop it waits up to
// DrainTimeout more, then releases the rest.
func (sub *Subscription) await(m *member, batch []*Delivery, renew <-chan time.Time) {
	for i := 0; i < len(batch); {
		select {
		case <-batch[i].done:
			i++
		case now := <-renew:
			sub.renewHeld(m, now, batch[i:])
			if early := sub.takeEarly(m, batch[i:], renew); len(early) > 0 {
				batch = append(slices.Clone(batch[i:]), early...)
				i = 0
			}
		case <-sub.stop.Done():
			sub.drain(m, batch[i:], renew)
			return
		}
	}
}

func (sub *Subscription) drain(m *member, batch []*Delivery, renew <-chan time.Time) {
	timer := time.NewTimer(sub.cfg.DrainTimeout)
	defer timer.Stop()
	for i := 0; i < len(batch); {
		select {
		case <-batch[i].done:
			i++
			continue
		case now := <-renew:
			sub.renewHeld(m, now, batch[i:])
			continue
		case <-timer.C:
		}
		for _, rest := range batch[i:] {
			rest.finish(kgo.AckRelease, ReleasedAtClose)
		}
		return
	}
}

// renewHeld renews the locks of the member's deliveries in batches and of
// the records kgo buffered for its next poll (see member.buffer).
func (sub *Subscription) renewHeld(m *member, now time.Time, batches ...[]*Delivery) {
	for _, batch := range batches {
		sub.renew(batch, now)
	}
	sub.renew(m.bufferedNow(), now)
}

// renewCheck is how often a member looks for acquisition locks to renew.
const renewCheck = 100 * time.Millisecond

// renew extends the acquisition lock (KIP-1222) of the deliveries still
// unanswered half-way through their lock, so that a long handler (or an
// unresolved Completion) keeps its record instead of seeing it delivered
// to another member.
func (sub *Subscription) renew(batch []*Delivery, now time.Time) {
	for _, d := range batch {
		if d.lockSpan <= 0 || now.Before(d.renewAt) || d.status.Load() != 0 {
			continue
		}
		d.rec.Ack(kgo.AckRenew)
		d.renewAt = now.Add(d.lockSpan / 2)
		d.m.renewals.wait(d.rec.Partition, renewal{d: d, until: now.Add(d.lockSpan).UnixNano()})
		sub.acked.Store(true) // flushed within AckFlushInterval
		sub.stats.update(d.ctr, func(c *Counters) { c.LockRenewals++ })
	}
}

// releaseRecords releases records taken but never made deliveries.
func (sub *Subscription) releaseRecords(recs []*kgo.Record) {
	for _, r := range recs {
		r.Ack(kgo.AckRelease)
		sub.stats.count(r.Topic, r.Partition, func(c *Counters) { c.Received++; c.Released++ })
	}
}

// leave sends every ack and release, cancels the messages' contexts and
// leaves the group. The releases wait until no member has a share fetch
// in flight: a fetch of a member whose poll the stop cancelled still waits
// at the broker (up to FetchMaxWait) for records to acquire, and a record
// released by a sibling member would be acquired by it, only to be
// released again at its Close: a delivery spent (see MaxDeliveries).
func (sub *Subscription) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), sub.cfg.DrainTimeout+5*time.Second)
	defer cancel()
	if len(sub.members) > 1 && sub.releasedStopping.Load() {
		sub.awaitFetches(ctx)
	}
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

// fetchSettleLimit bounds leave's wait for the members' share fetches in
// flight: kgo's FetchMaxWait (500 ms here unless ClientOptions say
// otherwise) and a round trip.
const fetchSettleLimit = 2 * time.Second

// awaitFetches waits until no member has a share fetch in flight, or
// fetchSettleLimit.
func (sub *Subscription) awaitFetches(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, fetchSettleLimit)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for sub.fetchesInFlight() {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// fetchesInFlight reports whether a member has a share fetch in flight.
func (sub *Subscription) fetchesInFlight() bool {
	for _, m := range sub.members {
		if m.fetchInFlight() {
			return true
		}
	}
	return false
}

// flushLoop sends the acks given since the last flush every
// AckFlushInterval: lock renewals, and the answers of the messages
// handed out, also while the subscription drains. Once it stops, nothing
// is sent until the members' fetches in flight are answered (see leave),
// for at most fetchSettleLimit.
func (sub *Subscription) flushLoop(done <-chan struct{}) {
	tick := time.NewTicker(sub.cfg.AckFlushInterval)
	defer tick.Stop()
	var stopped time.Time
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if sub.stop.Err() != nil && len(sub.members) > 1 {
			if stopped.IsZero() {
				stopped = time.Now()
			}
			if sub.fetchesInFlight() && time.Since(stopped) < fetchSettleLimit {
				continue
			}
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
func (sub *Subscription) ackResults(client *kgo.Client, results kgo.ShareAckResults) {
	var m *member
	for _, mm := range sub.members {
		if mm.client == client {
			m = mm
		}
	}
	for _, r := range results {
		if m != nil && r.Topic == sub.topic {
			m.renewals.answered(r.Partition, r.Err)
			m.acks.answered(r.Partition, r.Err)
		}
		if r.Err == nil {
			continue
		}
		sub.stats.count(r.Topic, r.Partition, func(c *Counters) { c.AckErrors++ })
		sub.logger.Error("Share acknowledgement refused; the broker delivers the records again", r.Err, watermill.LogFields{"partition": r.Partition})
	}
}

// track counts d in flight (Stats), handed out from now.
func (sub *Subscription) track(d *Delivery) {
	d.handedAt = time.Now()
	sub.mu.Lock()
	sub.inFlight[d] = struct{}{}
	sub.mu.Unlock()
}

func (sub *Subscription) untrack(d *Delivery) {
	sub.mu.Lock()
	delete(sub.inFlight, d)
	sub.mu.Unlock()
}

// readyHook follows the share group heartbeats for Ready. A heartbeat
// read tells both ways; a heartbeat that could not be written, or a failed
// connection to the broker that answered the last one, tells that the
// member is cut off: kgo then calls no read hook at all (a reset connection
// fails the write, a refused dial fails before any write), and Ready would
// go on reporting the last answer.
type readyHook struct{ m *member }

var (
	_ kgo.HookBrokerRead    = readyHook{}
	_ kgo.HookBrokerWrite   = readyHook{}
	_ kgo.HookBrokerConnect = readyHook{}
)

func (h readyHook) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.ShareGroupHeartbeat) {
		return
	}
	if err == nil {
		h.m.coordinator.Store(meta.NodeID)
		h.m.hasCoordinator.Store(true)
	}
	h.set(err)
}

func (h readyHook) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.ShareGroupHeartbeat) && err != nil {
		h.set(err)
	}
}

func (h readyHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil && h.m.hasCoordinator.Load() && meta.NodeID == h.m.coordinator.Load() {
		h.set(err)
	}
}

func (h readyHook) set(err error) {
	sub := h.m.sub
	if sub.stop.Err() != nil {
		return
	}
	if r := h.m.refusal.Load(); r != nil && err == nil {
		err = *r // a heartbeat read, not necessarily accepted
	}
	p, err := h.m.phase(err)
	sub.host.SetPhase(h.m, sub.topic, p, err)
}

// fetchHook notes when a member's share fetches are sent and answered
// (member.sent and member.answered).
type fetchHook struct{ m *member }

var (
	_ kgo.HookBrokerWrite         = fetchHook{}
	_ kgo.HookBrokerRead          = fetchHook{}
	_ kgo.HookFetchRecordBuffered = fetchHook{}
)

func (h fetchHook) OnFetchRecordBuffered(r *kgo.Record) { h.m.buffer(r) }

func (h fetchHook) OnBrokerWrite(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.ShareFetch) || err != nil {
		return
	}
	m := h.m
	m.sentMu.Lock()
	if m.sent == nil {
		m.sent, m.answered = make(map[int32]int64), make(map[int32]int64)
	}
	m.sent[meta.NodeID] = time.Now().UnixNano()
	m.sentMu.Unlock()
}

func (h fetchHook) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key != int16(kmsg.ShareFetch) {
		return
	}
	m := h.m
	if err == nil {
		m.noteFetchAnswered()
	}
	m.sentMu.Lock()
	if sent, ok := m.sent[meta.NodeID]; ok {
		m.answered[meta.NodeID] = sent
		delete(m.sent, meta.NodeID)
	}
	m.sentMu.Unlock()
}

// buffer notes a record kgo just buffered, and when, so that the member
// renews its acquisition lock while it waits and hands it out as a
// handler frees up (takeEarly). Records wait there when a fetch was sent
// after the member's poll had taken its records: kgo
// (MaxConcurrentFetches(0)) allows a fetch while a poll is active, and
// reads that a moment after the poll took the buffered records, so the
// next fetch can go out as the poll returns. Its records would otherwise
// wait for the member's next poll, which comes once its handlers answered
// the poll's messages: longer than a lock when they run long.
//
// It runs on kgo's fetch path, so it only notes: the record's delivery is
// made when the member needs it (bufferedRecord.delivery).
func (m *member) buffer(r *kgo.Record) {
	now := time.Now()
	m.bufferedMu.Lock()
	m.buffered = append(m.buffered, bufferedRecord{rec: r, at: now})
	m.bufferedMu.Unlock()
}

// bufferedRecord is a record kgo buffered for the member's next poll, when
// it did, and its delivery once made.
type bufferedRecord struct {
	rec *kgo.Record
	at  time.Time
	d   *Delivery
}

// delivery returns b's delivery, made now if need be from a fetch sent at
// fetched.
func (b *bufferedRecord) delivery(m *member, fetched time.Time) *Delivery {
	if b.d == nil {
		b.d = m.sub.newDelivery(m, b.rec, fetched, b.at)
	}
	return b.d
}

// takeBuffered returns the deliveries of the records kgo buffered, in
// order, made from fetches sent at fetched where not made yet.
func (m *member) takeBuffered(fetched time.Time) []*Delivery {
	m.bufferedMu.Lock()
	bs := m.buffered
	m.buffered = nil
	m.bufferedMu.Unlock()
	return m.deliveries(bs, fetched)
}

// bufferedNow returns the deliveries of the records waiting in kgo's
// buffer for the member's next poll, made now where need be.
func (m *member) bufferedNow() []*Delivery {
	m.bufferedMu.Lock()
	defer m.bufferedMu.Unlock()
	if len(m.buffered) == 0 {
		return nil
	}
	return m.deliveries(m.buffered, m.lastFetchSent(time.Now()))
}

// deliveries returns the deliveries of bs, made from fetches sent at
// fetched where not made yet (and kept in bs).
func (m *member) deliveries(bs []bufferedRecord, fetched time.Time) []*Delivery {
	ds := make([]*Delivery, len(bs))
	for i := range bs {
		ds[i] = bs[i].delivery(m, fetched)
	}
	return ds
}

// lastFetchSent returns when the fetches answered since the member's last
// poll were sent, at the earliest (or, without any, or): a record kgo
// buffers came with one of them.
func (m *member) lastFetchSent(or time.Time) time.Time {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	return m.earliestAnswered(or)
}

// earliestAnswered is lastFetchSent under sentMu.
func (m *member) earliestAnswered(or time.Time) time.Time {
	var from int64
	for _, sent := range m.answered {
		if from == 0 || sent < from {
			from = sent
		}
	}
	if from == 0 {
		return or
	}
	return time.Unix(0, from)
}

// fetchInFlight reports whether the member has a share fetch sent and not
// answered.
func (m *member) fetchInFlight() bool {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	return len(m.sent) > 0
}

// fetchedFrom returns when the fetches that brought the records of the
// poll that just returned were sent, at the earliest: the records were
// acquired after that. Each broker's last fetch answered since the last
// poll returned counts (an earlier one came back empty, or its records
// were taken by that poll); without any, the poll's start. The records'
// deliveries are made as kgo buffers them (member.buffer); this serves
// any it did not tell of.
func (m *member) fetchedFrom(pollStart time.Time) time.Time {
	m.sentMu.Lock()
	defer m.sentMu.Unlock()
	from := m.earliestAnswered(pollStart)
	clear(m.answered)
	return from
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
