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
	"sync"
	"sync/atomic"
	"time"

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

	// defaultTailBudget: TailMetadataBudget was left zero, so a lower
	// offset.metadata.max.bytes lowers it (see checkTailBudget).
	defaultTailBudget bool

	closing   chan struct{}
	closeOnce sync.Once
	closed    atomic.Bool
	// lifecycle orders Subscribe's start of a subscription against Close:
	// a subscription either starts before Close sets closed (and Close
	// waits for it in subs) or not at all.
	lifecycle sync.Mutex
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
		cfg:               cfg,
		commitEvery:       commitEvery,
		defaultTailBudget: config.TailMetadataBudget == 0,
		logger:            logger.With(watermill.LogFields{"subscriber_uuid": watermill.NewShortUUID()}),
		closing:           make(chan struct{}),
	}, nil
}

// Subscribe starts consuming topic and returns the channel its messages
// arrive on. Up to MaxInFlight messages may be unacked at once. The channel
// closes when ctx is cancelled or the Subscriber is closed, after the
// partitions drained.
//
// Subscribe connects before it returns: it fails when no broker can be
// reached within the time the Sarama config allows (Net.DialTimeout,
// Metadata.Retry, Metadata.Timeout), or ctx ends first, and when a
// TailMetadataBudget it was given is above the group coordinator's
// offset.metadata.max.bytes (the default budget is lowered to it). Once
// connected, a subscription whose connection fails reconnects every
// ReconnectRetrySleep until ctx ends or the Subscriber is closed; Ready
// tells whether it is consuming.
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
		halt:       newShutdown(),
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
	if err == nil {
		if s.cfg.ConsumerGroup == "" {
			sub.resolveFirstStarts(client)
		} else if partitions, perr := client.Partitions(topic); perr == nil {
			sub.firstPartitions = int32(len(partitions)) // see initialOffset
		}
	}
	s.lifecycle.Lock()
	if err == nil && s.closed.Load() {
		err = ErrSubscriberClosed
	}
	if err == nil {
		s.subs.Add(1) // before Close can Wait
	}
	s.lifecycle.Unlock()
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
	go func() {
		defer s.subs.Done()
		ended := make(chan struct{})
		defer close(ended)
		go func() {
			select {
			case <-s.closing:
			case <-ctx.Done():
			case <-ended:
				return
			}
			sub.halt.stop(s.cfg.closeBudget())
		}()
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
// cancelled, the final completed prefixes are committed (read back, and
// sent again while the coordinator refuses them), the group is left and
// every output channel is closed. When Close returns, every message
// context is cancelled. It is safe to call more than once and
// concurrently with acks.
//
// Close returns within DrainTimeout + min(max(DrainTimeout, 1 s), 5 s) +
// 2 s whatever the brokers do (gone, refusing, or not answering): after
// the drain, the final commit waits for the brokers at most the middle
// term, leaving the group at most a second more; then the connections
// still waiting for an answer are closed under their requests (Sarama
// would wait Net.ReadTimeout, 30 s by default, for each, and retry). A
// final position the group coordinator does not hold by then is logged as
// an Error that names each partition and offset (field "uncommitted"); the
// partition's next owner handles again the records acked after the
// position the group holds. In transactional mode, a transaction the
// broker does not answer in time is abandoned and logged as an Error (see
// TxnStats.Abandoned). Should a call outlive its closed connection, Close
// still returns at the bound, logs an Error, and that subscription's
// output channel closes when the call returns.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.lifecycle.Lock()
		s.closed.Store(true)
		s.lifecycle.Unlock()
		close(s.closing)
	})
	done := make(chan struct{})
	go func() {
		s.subs.Wait()
		close(done)
	}()
	// Each subscription abandons what still waits for a broker within
	// closeBudget (see shutdown); this is the last resort, should a call
	// outlive its connection.
	limit := s.cfg.closeBudget() + closeGrace
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.logger.Error("Close stopped waiting for its subscriptions; their output channels close once their last broker calls return",
			fmt.Errorf("subscriptions still running %v after Close", limit), watermill.LogFields{"close_limit": limit.String()})
	}
	return nil
}
