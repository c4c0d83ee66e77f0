package safeack

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/ready"
	"github.com/safeack/safeack/internal/sentinel"
	"github.com/safeack/safeack/internal/share"
)

// ErrShareGroupsUnsupported is returned by ShareSubscriber.Subscribe when the
// cluster does not serve share groups (Kafka before 4.2, or share groups not
// enabled on the brokers).
var ErrShareGroupsUnsupported = sentinel.ErrShareGroupsUnsupported

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
// Each Subscribe call runs Members members (one kgo client each) that hand
// out to the same MaxInFlight handlers. A member takes up to MaxPollRecords
// records per poll and polls again only once every message of the last
// poll is answered: the share group client accepts at the next poll what
// the last one left unanswered (Kafka's own share consumer has the same
// rule). The records of a poll wait in the member, their locks renewed,
// until handlers are free; while one member waits for its next poll (or
// for a slow message of its last one), the other members' records keep the
// handlers busy.
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
	cfg  ShareSubscriberConfig
	opts share.Options

	subscriptions

	ready ready.Tracker
	stats share.Registry
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
	cfg := config.withDefaults()
	return &ShareSubscriber{
		cfg:           cfg,
		opts:          cfg.options(logger.With(watermill.LogFields{"subscriber_uuid": watermill.NewShortUUID()})),
		subscriptions: subscriptions{closing: make(chan struct{})},
	}, nil
}

// Subscribe joins the share group for topic and returns the channel its
// messages arrive on. Up to MaxInFlight messages are handed out and
// unanswered at once; up to Members x MaxPollRecords records are held
// (twice that at most, see MaxPollRecords).
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
	sub, err := share.Start(ctx, &s.opts, (*shareHost)(s), topic)
	if err != nil {
		return nil, err
	}
	if !s.admit() {
		sub.Abort()
		return nil, ErrSubscriberClosed
	}
	sub.Run(s.subs.Done)
	return sub.Output(), nil
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
	return share.CheckGroups(ctx, brokers, opts...)
}

// Close stops every subscription: nothing more is handed out, answers to
// the messages handed out are awaited up to DrainTimeout while their
// contexts stay alive, then the records still unanswered are released,
// every ack and release is sent to the broker, the members leave the
// share group, every message context is cancelled and every output channel
// is closed. Safe to call more than once.
func (s *ShareSubscriber) Close() error {
	s.beginClose()
	s.subs.Wait()
	return nil
}

// Ready reports whether every subscription is a member of its share group
// holding partitions, as Subscriber.Ready does: nil when every member of
// every Subscribe call not yet ended had its last share group heartbeat
// answered and has had a share fetch answered (kgo fetches only the
// partitions the member was assigned), else an error wrapping ErrNotReady
// that says what each is doing. A member whose heartbeat could not be
// sent, or whose coordinator cannot be reached, is not ready until a
// heartbeat is answered again. A new member gets its partitions a
// heartbeat after it joined (share.heartbeat.interval.ms, 5 s by
// default), and only once the broker has initialized the group's
// share-partition state for them: on a cluster where no share group ran
// before, the broker first creates and loads its share-state topic, which
// took 2-7 s on a test broker (see docs/share-groups.md); a member still
// without partitions after 12 s logs it. Before the first Subscribe it
// reports ErrNotReady, after Close ErrSubscriberClosed. It does no I/O.
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
// until all its partitions have leaders, connecting as the members do
// (ClientOptions: TLS, SASL, a dialer).
func (s *ShareSubscriber) SubscribeInitialize(topic string) (err error) {
	if s.cfg.InitializeTopicDetails == nil {
		return errors.New("safeack: InitializeTopicDetails is empty, cannot SubscribeInitialize")
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WaitForTopicCreationTimeout)
	defer cancel()
	if err := share.InitializeTopic(ctx, s.cfg.Brokers, s.cfg.ClientOptions, topic, s.cfg.InitializeTopicDetails); err != nil {
		return fmt.Errorf("safeack: %w", err)
	}
	return nil
}

// shareHost is the ShareSubscriber as its subscriptions see it
// (share.Host).
type shareHost ShareSubscriber

var _ share.Host = (*shareHost)(nil)

func (h *shareHost) Closing() <-chan struct{} { return h.closing }

func (h *shareHost) SetPhase(member any, topic string, p ready.Phase, err error) {
	h.ready.Set(member, topic, h.cfg.ShareGroup, "share group", p, err)
}

func (h *shareHost) Ended(member any) { h.ready.Remove(member) }

func (h *shareHost) Registry() *share.Registry { return &h.stats }
