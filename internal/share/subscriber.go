package share

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

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
	// lastFreed is when a handler last freed up (unix nanoseconds; the
	// subscription's start before any did), for mayPoll.
	lastFreed atomic.Int64

	// brokerDLQ is the share group's dead-letter topic at the broker when
	// records past MaxDeliveries are REJECTed for it (chooseDeadLetter).
	brokerDLQ string

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
	sub.lastFreed.Store(time.Now().UnixNano())
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
	if err := sub.chooseDeadLetter(ctx, admin); err != nil {
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

// freeHandler frees the handler a message held.
func (sub *Subscription) freeHandler() {
	<-sub.handlers
	sub.lastFreed.Store(time.Now().UnixNano())
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
