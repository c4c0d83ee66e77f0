package safeack

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/share"
)

// Defaults applied by NewShareSubscriber to zero-valued fields.
const (
	// DefaultShareMaxDeliveries equals the broker's default
	// group.share.delivery.count.limit (5).
	DefaultShareMaxDeliveries = 5
	// DefaultShareAckFlushInterval bounds how long an ack waits before it
	// is sent when no fetch carries it sooner.
	DefaultShareAckFlushInterval = 100 * time.Millisecond
	// DefaultShareMembers is the members each Subscribe call runs: two,
	// so that one polls while the other's records are handled.
	DefaultShareMembers = 2
	// defaultSharePollFactor is MaxPollRecords' default over MaxInFlight.
	defaultSharePollFactor = 4
)

// ShareSubscriberConfig configures a ShareSubscriber: a Watermill subscriber
// on a Kafka share group (KIP-932, Kafka 4.2 and later). Field names shared
// with SubscriberConfig have the same meaning. Copied from a
// SubscriberConfig, three fields differ: Ordering is a pointer here (nil,
// or Unordered), the group is ShareGroup, and the client is configured with
// kgo options (ClientOptions) rather than a Sarama config; docs/share-groups.md
// ("From a SubscriberConfig") lists them all.
//
// Share groups keep no order: records of one partition are handed to any
// member, and to one member's handlers, at the same time and complete in
// any order; a released record comes back after records behind it. Use a
// Subscriber (a consumer group) when order matters.
type ShareSubscriberConfig struct {
	// Brokers lists the Kafka bootstrap brokers, host:port.
	Brokers []string

	// ShareGroup is the share group the subscriber joins. Required.
	ShareGroup string

	// Unmarshaler turns Kafka records into Watermill messages. The record is
	// given as a *sarama.ConsumerMessage (topic, partition, offset, key,
	// value, headers, timestamp), so a watermill-kafka Unmarshaler works
	// unchanged. Default: kafka.DefaultMarshaler{}.
	Unmarshaler kafka.Unmarshaler

	// Ordering must be nil or point to Unordered: share groups promise no
	// order. It is a pointer because the zero Ordering is OrderByKey: a
	// SubscriberConfig's Ordering: Unordered becomes Ordering: &u (u :=
	// safeack.Unordered), or is left out. A configuration carried over
	// from a Subscriber with OrderByKey or OrderByPartition is refused
	// rather than run unordered without a word.
	Ordering *Ordering

	// MaxInFlight bounds the messages handed out by one Subscribe call and
	// not yet acked or nacked, across its members: the concurrency a
	// Watermill router gets from this subscriber, as with a Subscriber. A
	// deferred completion stops counting once its message is acked.
	// Default 64.
	MaxInFlight int

	// MaxPollRecords is the most records a member takes from the share
	// group per poll (with ShareAcquireRecordLimit, the default
	// AcquireMode; see AcquireMode for the other). A member polls again only once every message of its
	// last poll is answered (kgo accepts what a poll left unanswered when
	// it polls again; Kafka's own share consumer has the same rule), and
	// a broker serves one share fetch of a partition at a time, a few
	// milliseconds each: polls of MaxInFlight records would leave the
	// handlers idle while the next one is on its way. The records a poll
	// brings beyond the free handlers wait in the member, their
	// acquisition locks renewed, and are handed out as handlers free up.
	// Up to Members x MaxPollRecords records are held by one Subscribe
	// call at once (twice that at most, when a member's client fetched
	// again as its poll returned), out of other consumers' reach until
	// answered: lower it when many processes share few partitions and
	// each should get a part of a short backlog. Default 4 x MaxInFlight.
	MaxPollRecords int

	// AcquireMode is how the broker acquires records for a member's
	// fetch (KIP-1206). ShareAcquireRecordLimit, the default, acquires at
	// most MaxPollRecords records, splitting the broker's stored batches:
	// MaxPollRecords bounds what a member holds, and a short backlog is
	// spread over the members of every process. ShareAcquireBatchOptimized
	// (Kafka's own consumer's default) acquires whole stored batches, so a
	// fetch may bring many more records than MaxPollRecords (all of a
	// producer's batch; the member takes and renews them all): fewer
	// fetches, and less CPU per record where records are small and
	// batches large, at the cost of one member holding a whole batch
	// while other members idle.
	AcquireMode ShareAcquireMode

	// Members is how many members of the share group each Subscribe call
	// runs (one kgo client each), all handing out on its channel to the
	// same MaxInFlight handlers. Two members take turns: while one waits
	// for its poll, or for the slowest message of its last one, the
	// other's records keep the handlers busy. Default
	// DefaultShareMembers.
	Members int

	// MaxDeliveries is the delivery attempt at which a Nack no longer
	// releases the record: it is rejected instead (or dead-lettered, see
	// DeadLetter), and a record that arrives with a delivery count above it
	// (after acquisition lock timeouts) is not handed out but dealt with the
	// same way. Keep it at or below the broker's
	// group.share.delivery.count.limit (default 5): past that limit the
	// broker archives a released record itself, unseen by safeack.
	// Default DefaultShareMaxDeliveries.
	MaxDeliveries int

	// DeadLetter, when set, is called for a record past MaxDeliveries
	// instead of rejecting it, with its message (the message's context is
	// the subscription's). When it returns nil the record is accepted; when
	// it returns an error, the error is logged and DeadLetter is called
	// again, with backoff (up to 1 s), while the record stays held, its
	// acquisition lock renewed, until it succeeds or the subscriber closes;
	// then the record is released (at the broker's delivery count limit,
	// the broker archives it). A release would not bring it back: with the
	// defaults a record reaching DeadLetter is at the broker's limit.
	// When the share group has a usable dead-letter topic at the broker,
	// DeadLetterTarget's default sends the record there instead.
	DeadLetter func(ctx context.Context, msg *message.Message) error

	// DeadLetterTarget says where a record past MaxDeliveries goes when
	// the share group has a dead-letter topic of its own at the broker
	// (KIP-1191, Kafka 4.4 with share.version 2: the group config
	// errors.deadletterqueue.topic.name), to which the broker writes every
	// REJECTed record of the group with its context. The default,
	// ShareDeadLetterAuto, sends it there; see ShareDeadLetterTarget.
	DeadLetterTarget ShareDeadLetterTarget

	// OnUnmarshalError decides the fate of a record the Unmarshaler
	// rejects. Nil (the default) rejects the record and logs the error. A
	// non-nil handler is given the raw record instead: when it returns nil
	// the record is accepted (for example after publishing it to a
	// dead-letter topic), and when it returns an error the record is
	// released, to be tried at its next delivery.
	OnUnmarshalError func(ctx context.Context, msg *sarama.ConsumerMessage, err error) error

	// InitialOffset is where the share group starts on a partition it has
	// no state for: sarama.OffsetOldest (the log start) or
	// sarama.OffsetNewest (records produced from then on, the broker's
	// default). Subscribe sets the group's share.auto.offset.reset config
	// accordingly (IncrementalAlterConfigs on the group). Zero leaves the
	// group's config as it is.
	InitialOffset int64

	// AckFlushInterval is the longest an ack waits before Subscribe's
	// client sends it: acks ride on the next fetch when one goes out
	// sooner. Default DefaultShareAckFlushInterval.
	AckFlushInterval time.Duration

	// DrainTimeout is how long Close (or the end of Subscribe's context)
	// waits for handed-out messages to be answered before it cancels their
	// contexts and releases their records. Acks given in time are sent
	// before the member leaves. Default DefaultDrainTimeout.
	DrainTimeout time.Duration

	// InitializeTopicDetails is used by SubscribeInitialize to create the
	// topic.
	InitializeTopicDetails *sarama.TopicDetail

	// WaitForTopicCreationTimeout bounds SubscribeInitialize's wait for the
	// topic's partitions to have leaders. Default 10 s.
	WaitForTopicCreationTimeout time.Duration

	// Observer, when set, is told of every message handed out and of what
	// became of it, for tracing (package
	// github.com/safeack/safeack/otel implements it): Delivered as the
	// message is made from a polled record, just before it is handed out
	// (with Delivery.DeliveryCount set and Delivery.Group the share
	// group; one that the subscription's end keeps from being handed out
	// is reported abandoned), then
	// Answered once the record's acknowledgement is decided (OutcomeAck,
	// OutcomeNack for a release, a rejection or a dead-lettered record,
	// OutcomeSkipped, OutcomeAbandoned when the subscription ended first;
	// OutcomeDeferred before, when the handler defers), and, when the
	// DeliveryObserver is a ShareDeliveryObserver, Acknowledged with the
	// acknowledgement sent and the broker's answer. Committed is never
	// called: a share group commits nothing, the broker tracks each
	// record. Records answered without being handed out (the
	// Unmarshaler rejected them, or they arrived past MaxDeliveries) are
	// not observed: Stats counts them. Nil (the default) costs nothing.
	Observer Observer

	// ClientOptions are added to the kgo client options of each member
	// (for example kgo.DialTLSConfig, kgo.SASL, kgo.ClientID,
	// kgo.FetchMaxWait). They must not name topics, groups or partitions
	// to consume: the group, the topic and the share fetch size are
	// safeack's, set after these.
	ClientOptions []kgo.Opt
}

func (c ShareSubscriberConfig) withDefaults() ShareSubscriberConfig {
	if c.Unmarshaler == nil {
		c.Unmarshaler = kafka.DefaultMarshaler{}
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = min(defaultSharePollFactor*c.MaxInFlight, maxSharePollRecords)
	}
	if c.Members == 0 {
		c.Members = DefaultShareMembers
	}
	if c.MaxDeliveries == 0 {
		c.MaxDeliveries = DefaultShareMaxDeliveries
	}
	if c.AckFlushInterval == 0 {
		c.AckFlushInterval = DefaultShareAckFlushInterval
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.WaitForTopicCreationTimeout == 0 {
		c.WaitForTopicCreationTimeout = 10 * time.Second
	}
	return c
}

// ShareAcquireMode is how a share group's broker acquires records for a
// fetch (KIP-1206's share.acquire.mode); see
// ShareSubscriberConfig.AcquireMode.
type ShareAcquireMode int

// Share acquisition modes.
const (
	// ShareAcquireRecordLimit acquires at most MaxPollRecords records per
	// fetch (record_limit).
	ShareAcquireRecordLimit ShareAcquireMode = iota
	// ShareAcquireBatchOptimized acquires whole stored batches
	// (batch_optimized).
	ShareAcquireBatchOptimized
)

// String returns the mode's name in Kafka's share.acquire.mode.
func (m ShareAcquireMode) String() string {
	switch m {
	case ShareAcquireRecordLimit:
		return "record_limit"
	case ShareAcquireBatchOptimized:
		return "batch_optimized"
	}
	return fmt.Sprintf("ShareAcquireMode(%d)", int(m))
}

// ShareDeadLetterTarget says where a ShareSubscriber sends a record past
// MaxDeliveries (ShareSubscriberConfig.DeadLetterTarget). Whatever it
// says, a record is REJECTed (RejectPoison, an unmarshal failure without
// OnUnmarshalError, past MaxDeliveries without DeadLetter) goes to the
// group's broker-side dead-letter topic when the group names one: the
// broker writes it there, not safeack.
type ShareDeadLetterTarget int

// Dead-letter targets.
const (
	// ShareDeadLetterAuto, the default: when DeadLetter is set, Subscribe
	// reads the share group's errors.deadletterqueue.topic.name
	// (DescribeConfigs on the group). When it names a topic, a record past
	// MaxDeliveries is REJECTed and the broker writes it to that topic,
	// and DeadLetter is not called; otherwise (no topic named, a broker
	// before Kafka 4.4, or a config the principal may not read: logged)
	// DeadLetter takes it, then it is ACCEPTed. Without DeadLetter the
	// record is REJECTed either way. The group's config is read at each
	// Subscribe: a change takes effect at the next one.
	ShareDeadLetterAuto ShareDeadLetterTarget = iota
	// ShareDeadLetterBroker: a record past MaxDeliveries is REJECTed, for
	// the broker's dead-letter topic. Subscribe fails unless the group
	// names one (a broker before Kafka 4.4, or a group without
	// errors.deadletterqueue.topic.name). DeadLetter must be nil.
	ShareDeadLetterBroker
	// ShareDeadLetterClient: a record past MaxDeliveries goes to
	// DeadLetter, then is ACCEPTed, bypassing the group's dead-letter topic
	// at the broker (which is not read). DeadLetter must be set.
	ShareDeadLetterClient
)

// String names the target: auto, broker or client.
func (t ShareDeadLetterTarget) String() string {
	switch t {
	case ShareDeadLetterAuto:
		return "auto"
	case ShareDeadLetterBroker:
		return "broker"
	case ShareDeadLetterClient:
		return "client"
	}
	return fmt.Sprintf("ShareDeadLetterTarget(%d)", int(t))
}

// maxSharePollRecords bounds MaxPollRecords: a share fetch's MaxRecords is
// an int32, and a broker holds at most group.share.partition.max.record.locks
// (2,000 by default, 4,000 at most by default) records of a partition
// acquired at once.
const maxSharePollRecords = 1 << 16

// options returns what the subscriptions need of c, c's defaults applied.
func (c ShareSubscriberConfig) options(logger watermill.LoggerAdapter) share.Options {
	o := share.Options{
		Brokers:          c.Brokers,
		ShareGroup:       c.ShareGroup,
		Unmarshaler:      c.Unmarshaler,
		MaxInFlight:      c.MaxInFlight,
		MaxPollRecords:   c.MaxPollRecords,
		WholeBatches:     c.AcquireMode == ShareAcquireBatchOptimized,
		Members:          c.Members,
		MaxDeliveries:    c.MaxDeliveries,
		DeadLetter:       c.DeadLetter,
		DeadLetterTarget: share.DeadLetterTarget(c.DeadLetterTarget),
		OnUnmarshalError: c.OnUnmarshalError,
		InitialOffset:    c.InitialOffset,
		AckFlushInterval: c.AckFlushInterval,
		DrainTimeout:     c.DrainTimeout,
		ClientOptions:    c.ClientOptions,
		Logger:           logger,
	}
	if c.Observer != nil {
		o.Observer = shareObserver{o: c.Observer, group: c.ShareGroup}
	}
	return o
}

// Validate reports the first invalid field of c, after defaults are
// applied. Each error wraps ErrInvalidConfig and names the field.
func (c ShareSubscriberConfig) Validate() error {
	c = c.withDefaults()
	if len(c.Brokers) == 0 {
		return fieldError("Brokers", "no brokers given")
	}
	for i, b := range c.Brokers {
		if b == "" {
			return fieldError("Brokers", "entry %d is empty", i)
		}
	}
	if c.ShareGroup == "" {
		return fieldError("ShareGroup", "empty: a share subscriber needs a share group")
	}
	if c.Ordering != nil && *c.Ordering != Unordered {
		return fieldError("Ordering", "%v: share groups keep no order (records of a partition go to every member at once and complete in any order); use Unordered, or a Subscriber on a consumer group to keep order", *c.Ordering)
	}
	if c.MaxInFlight < 0 {
		return fieldError("MaxInFlight", "negative size %d", c.MaxInFlight)
	}
	if c.MaxInFlight > 1<<20 {
		return fieldError("MaxInFlight", "%d is above %d messages", c.MaxInFlight, 1<<20)
	}
	if c.MaxPollRecords < 0 {
		return fieldError("MaxPollRecords", "negative size %d", c.MaxPollRecords)
	}
	if c.MaxPollRecords > maxSharePollRecords {
		return fieldError("MaxPollRecords", "%d is above %d records per poll", c.MaxPollRecords, maxSharePollRecords)
	}
	if c.AcquireMode != ShareAcquireRecordLimit && c.AcquireMode != ShareAcquireBatchOptimized {
		return fieldError("AcquireMode", "%v: ShareAcquireRecordLimit or ShareAcquireBatchOptimized", c.AcquireMode)
	}
	if c.Members < 0 || c.Members > 64 {
		return fieldError("Members", "%d is not between 1 and 64", c.Members)
	}
	if c.MaxDeliveries < 0 {
		return fieldError("MaxDeliveries", "negative count %d", c.MaxDeliveries)
	}
	switch c.DeadLetterTarget {
	case ShareDeadLetterAuto:
	case ShareDeadLetterBroker:
		if c.DeadLetter != nil {
			return fieldError("DeadLetter", "set, but DeadLetterTarget is ShareDeadLetterBroker: records past MaxDeliveries go to the broker's dead-letter topic, never to DeadLetter")
		}
	case ShareDeadLetterClient:
		if c.DeadLetter == nil {
			return fieldError("DeadLetterTarget", "ShareDeadLetterClient needs DeadLetter")
		}
	default:
		return fieldError("DeadLetterTarget", "%v: ShareDeadLetterAuto, ShareDeadLetterBroker or ShareDeadLetterClient", c.DeadLetterTarget)
	}
	switch c.InitialOffset {
	case 0, sarama.OffsetOldest, sarama.OffsetNewest:
	default:
		return fieldError("InitialOffset", "%d: only sarama.OffsetOldest (%d) or sarama.OffsetNewest (%d) (share.auto.offset.reset earliest or latest), or zero to leave the group's config", c.InitialOffset, sarama.OffsetOldest, sarama.OffsetNewest)
	}
	if c.AckFlushInterval < 0 {
		return fieldError("AckFlushInterval", "negative duration %v", c.AckFlushInterval)
	}
	if c.AckFlushInterval > 0 && c.AckFlushInterval < minCommitInterval {
		return fieldError("AckFlushInterval", "%v is below %v", c.AckFlushInterval, minCommitInterval)
	}
	if c.DrainTimeout < 0 {
		return fieldError("DrainTimeout", "negative duration %v", c.DrainTimeout)
	}
	if c.WaitForTopicCreationTimeout < 0 {
		return fieldError("WaitForTopicCreationTimeout", "negative duration %v", c.WaitForTopicCreationTimeout)
	}
	for i, o := range c.ClientOptions {
		if o == nil {
			return fieldError("ClientOptions", "entry %d is nil", i)
		}
	}
	return nil
}
