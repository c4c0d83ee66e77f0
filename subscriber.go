package safeack

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/internal/consume"
	"github.com/safeack/safeack/internal/ready"
	"github.com/safeack/safeack/internal/sentinel"
)

// ErrSubscriberClosed is returned by Subscribe after Close.
var ErrSubscriberClosed = sentinel.ErrSubscriberClosed

// Subscriber consumes Kafka topics through a Sarama consumer group and
// implements message.Subscriber and message.SubscribeInitializer.
type Subscriber struct {
	cfg    SubscriberConfig
	logger watermill.LoggerAdapter
	// opts is what the subscriptions need of cfg (see
	// SubscriberConfig.options).
	opts consume.Options

	subscriptions
	// instanceTopic is the topic of the live subscription that holds the
	// static member (Consumer.Group.InstanceId), if any; under lifecycle.
	// Every subscription is a group member of its own, and two members
	// with one instance id fence each other (see ErrInstanceFenced).
	instanceTopic string

	// txn makes the subscriptions commit through Kafka transactions (see
	// NewTxnSubscriber). Only the deprecated NewTxnPublisher sets it after
	// NewSubscriber, under lifecycle and while subscribed (set by the
	// first Subscribe, under lifecycle) is false.
	txn        *TxnPublisher
	subscribed bool

	registry  registry
	unclaimed unclaimedSet  // for Unclaimed
	ready     ready.Tracker // for Ready and WaitReady
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
	// safeack commits itself, every cfg.CommitInterval (see its doc), so
	// that a completed tail is encoded just before each commit rather than
	// on a tick of its own, and so that a partition with nothing left
	// running is committed at once (see offsetCommitter.commitLoop). The
	// copy is safeack's own.
	logger = logger.With(watermill.LogFields{"subscriber_uuid": watermill.NewShortUUID()})
	if unused, ok := autoCommitIntervalUnused(config, cfg.OverwriteSaramaConfig); ok {
		logger.Info("CommitInterval sets the commit period; Sarama's Consumer.Offsets.AutoCommit.Interval is not used",
			watermill.LogFields{"commit_interval": cfg.CommitInterval.String(), "unused_auto_commit_interval": unused.String()})
	}
	cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = false
	return &Subscriber{
		cfg:           cfg,
		opts:          cfg.options(logger, config.TailMetadataBudget == 0),
		logger:        logger,
		subscriptions: subscriptions{closing: make(chan struct{})},
	}, nil
}

// CommitInterval returns the period at which the Subscriber commits the
// completed prefixes: SubscriberConfig.CommitInterval when it was set, else
// Sarama's auto-commit interval when auto-commit is on, else 1 s; for a
// transactional Subscriber, TxnConfig.CommitInterval.
func (s *Subscriber) CommitInterval() time.Duration {
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()
	if s.txn != nil {
		return s.txn.cfg.CommitInterval
	}
	return s.opts.CommitEvery
}

// Subscribe starts consuming topic and returns the channel its messages
// arrive on. Up to MaxInFlight messages may be unacked at once. The channel
// closes when ctx is cancelled or the Subscriber is closed, after the
// partitions drained, and when another consumer with the same
// Consumer.Group.InstanceId fenced the subscription's group member (see
// ErrInstanceFenced; Ready then reports it).
//
// Subscribe connects before it returns: it fails when no broker can be
// reached within the time the Sarama config allows (Net.DialTimeout,
// Metadata.Retry, Metadata.Timeout), or ctx ends first, and when a
// TailMetadataBudget it was given is above the group coordinator's
// offset.metadata.max.bytes (the default budget is lowered to it). Once
// connected, a subscription whose connection fails reconnects every
// ReconnectRetrySleep until ctx ends or the Subscriber is closed; Ready
// tells whether it is consuming.
//
// With a Consumer.Group.InstanceId (static membership), a Subscriber holds
// one subscription at a time: each subscription is a group member of its
// own, and two members with one instance id fence each other. Subscribe
// then fails with ErrInvalidConfig while another subscription of the
// Subscriber runs.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.closed.Load() {
		return nil, ErrSubscriberClosed
	}
	if topic == "" {
		return nil, errors.New("safeack: empty topic")
	}
	pub := s.transactional()
	if err := s.holdInstance(topic); err != nil {
		return nil, err
	}
	held := true
	defer func() {
		if held {
			s.releaseInstance()
		}
	}()
	var txn *consume.Txn
	if pub != nil {
		txn = pub.txn
	}
	sub, err := consume.Start(ctx, &s.opts, (*host)(s), topic, txn)
	if err != nil {
		return nil, err
	}
	if !s.admit() {
		sub.Abort()
		return nil, ErrSubscriberClosed
	}
	held = false // released when the subscription's member has left
	sub.Run(ctx, s.releaseInstance, s.subs.Done)
	return sub.Output(), nil
}

// holdInstance reserves the static member for a subscription to topic, when
// the config names one (Consumer.Group.InstanceId with a ConsumerGroup). A
// second live subscription of this Subscriber would join as a second
// member with the same instance id, and the coordinator would fence the
// first: it is refused.
func (s *Subscriber) holdInstance(topic string) error {
	id := s.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId
	if id == "" || s.cfg.ConsumerGroup == "" {
		return nil
	}
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()
	if s.instanceTopic != "" {
		return fmt.Errorf("%w: Consumer.Group.InstanceId %q is held by this Subscriber's subscription to %q; "+
			"each subscription is a group member of its own and two members cannot share an instance id "+
			"(subscribe to %q with another Subscriber and its own InstanceId)", ErrInvalidConfig, id, s.instanceTopic, topic)
	}
	s.instanceTopic = topic
	return nil
}

// releaseInstance frees what holdInstance reserved.
func (s *Subscriber) releaseInstance() {
	if s.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId == "" || s.cfg.ConsumerGroup == "" {
		return
	}
	s.lifecycle.Lock()
	s.instanceTopic = ""
	s.lifecycle.Unlock()
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
	s.beginClose()
	done := make(chan struct{})
	go func() {
		s.subs.Wait()
		close(done)
	}()
	// Each subscription abandons what still waits for a broker within
	// closeBudget (see shutdown); this is the last resort, should a call
	// outlive its connection.
	limit := s.opts.CloseBudget() + consume.CloseGrace
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
