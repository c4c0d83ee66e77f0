package safeack

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/internal/consume"
)

// DefaultTxnCommitInterval is how often the open transaction commits when
// TxnConfig.CommitInterval is zero.
const DefaultTxnCommitInterval = 100 * time.Millisecond

// ErrNoDelivery is returned by TxnPublisher.Publish for an output message
// whose context does not lead to the delivery it is the output of. Outputs
// returned by a handler get it from TxnPublisher.Middleware; a handler that
// publishes itself sets it with out.SetContext(msg.Context()).
var ErrNoDelivery = errors.New("safeack: output message does not carry the context of a delivery of the transactional subscriber (use TxnPublisher.Middleware, or out.SetContext(msg.Context()))")

// TxnConfig configures exactly-once routing: see NewTxnSubscriber.
type TxnConfig struct {
	// TransactionalID names this instance of the router to Kafka's
	// transaction coordinator; each subscription's producer uses
	// TransactionalID + "-" + topic. It must be unique among the instances
	// running at once (two instances with one id fence each other) and
	// should stay the same when an instance restarts (a pod name, a host
	// name): the restarted producer then aborts at once what a crashed one
	// left open, instead of read_committed readers of the outputs waiting
	// for Producer.Transaction.Timeout. Required.
	TransactionalID string

	// CommitInterval is how often the open transaction commits the outputs
	// of the records acked since the last one, with the consumer offsets
	// that cover them. Default DefaultTxnCommitInterval (100 ms). A shorter
	// interval makes outputs visible sooner to read_committed readers, a
	// longer one costs fewer commits. At least 1 ms: a transaction takes
	// several round trips to the broker, and a shorter tick only spins.
	CommitInterval time.Duration

	// Marshaler turns output messages into Kafka records. Default
	// kafka.DefaultMarshaler{}.
	Marshaler kafka.Marshaler

	// Brokers for the transactional producer. Default: the subscriber's.
	// Outputs and consumer offsets must be on the same cluster: a Kafka
	// transaction does not span clusters.
	Brokers []string

	// OverwriteSaramaConfig holds the producer's Sarama settings. Default: a
	// copy of the subscriber's. Whatever is given, safeack sets what a
	// transactional producer needs (Idempotent, RequiredAcks WaitForAll,
	// Net.MaxOpenRequests 1, Producer.Transaction.ID, Return.Successes and
	// Return.Errors) on its own copy. Version must be at least 2.5.0, the
	// first that sends the consumer's generation and member id with the
	// offsets (KIP-447 fencing).
	OverwriteSaramaConfig *sarama.Config
}

// TxnPublisher makes a Subscriber's consume-transform-produce routing
// exactly-once for Kafka outputs: each input record's outputs become
// visible to read_committed readers exactly once, together with the
// consumer offset that covers the record, across crashes, rebalances and
// closes.
//
// It is the router's publisher for handlers that return messages (with
// Middleware), and the publisher a handler calls itself for outputs whose
// context is the input's (out.SetContext(msg.Context())). Publish only
// buffers the outputs in memory with the delivery they belong to: they enter
// a Kafka transaction when that delivery is acked (the handler succeeded)
// and never when it is nacked. Every CommitInterval the subscription's
// transactional producer adds the completed prefix of each partition (with
// the completed tail in the offset metadata) to a transaction, writes the
// outputs of the records that position covers and were not written yet,
// and commits. Outputs of a record completed above a slower one wait until
// a committed position covers it. Handlers keep running meanwhile: outputs
// acked during a commit go into a later one.
//
// A transaction that fails (the broker aborted or fenced it, the member
// lost the group) is aborted; the subscription then ends its consumer
// group session, so that its partitions are fetched again from their last
// committed position and the records whose outputs were discarded are
// handled again.
//
// At Close, a transaction the broker does not answer in time (the same
// wait as the final commit's, see Subscriber.Close) is abandoned: it is
// committed or aborted as a whole, outputs and offsets together, whichever
// the broker does; left open, the next producer with the same
// TransactionalID aborts it when it starts (or the broker does after
// Producer.Transaction.Timeout). Close logs it as an Error, with the
// positions in it (field "in_doubt"), and nothing is committed after it.
//
// Publish, Middleware and Close are safe for concurrent use.
type TxnPublisher struct {
	sub    *Subscriber
	cfg    TxnConfig
	logger watermill.LoggerAdapter
	// txn is what the Subscriber's transactional committers share with it:
	// the producer's config, the topics subscribed, the counters.
	txn *consume.Txn
}

var _ message.Publisher = (*TxnPublisher)(nil)

// NewTxnSubscriber validates config and txn and returns a transactional
// Subscriber and the TxnPublisher wired to it: the Subscriber commits its
// consumer offsets only inside the transactions that carry its handlers'
// outputs, and never through the consumer group's own OffsetCommit (except
// the start position of a partition the group has never committed, which
// carries no output). config needs a ConsumerGroup and a Sarama Version of
// at least 2.5.0; the Subscriber's consumer reads with IsolationLevel
// ReadCommitted (so that a new owner of a partition waits for its previous
// owner's open transaction, KIP-447). Eager and cooperative rebalancing
// (sarama.NewBalanceStrategyCooperativeSticky) are both supported: a
// partition revoked by a cooperative rebalance commits its outputs and
// final position in a transaction before the revocation completes, while
// the member's other partitions go on. A nil logger disables logging.
//
// Invalid configuration gives an error wrapping ErrInvalidConfig that
// names the field: config's fields as NewSubscriber names them, txn's with
// the prefix "TxnConfig.", and those of config that transactional mode
// constrains further with the prefix "SubscriberConfig.".
func NewTxnSubscriber(config SubscriberConfig, txn TxnConfig, logger watermill.LoggerAdapter) (*Subscriber, *TxnPublisher, error) {
	if err := config.Validate(); err != nil {
		return nil, nil, err
	}
	sc := config.withDefaults()
	txn, pcfg, err := txn.withSubscriber(&sc)
	if err != nil {
		return nil, nil, err
	}
	config.OverwriteSaramaConfig = readCommitted(sc.OverwriteSaramaConfig)
	sub, err := NewSubscriber(config, logger)
	if err != nil {
		return nil, nil, err
	}
	if config.CommitInterval != 0 {
		sub.logger.Info("SubscriberConfig.CommitInterval is not used in transactional mode: TxnConfig.CommitInterval sets the commit period",
			watermill.LogFields{"commit_interval": txn.CommitInterval.String(), "unused_subscriber_commit_interval": config.CommitInterval.String()})
	}
	pub := newTxnPublisher(sub, txn, pcfg, logger)
	sub.txn = pub // before anyone else has sub
	return sub, pub, nil
}

// NewTxnPublisher makes sub transactional, as NewTxnSubscriber makes a
// Subscriber, and returns its TxnPublisher. It must be called before the
// first sub.Subscribe, and once: later it fails with ErrInvalidConfig. sub
// must have a ConsumerGroup and a Sarama Version of at least 2.5.0.
//
// Deprecated: use NewTxnSubscriber, which builds the Subscriber and its
// TxnPublisher together, so that no Subscriber is ever used before it is
// transactional.
func NewTxnPublisher(sub *Subscriber, config TxnConfig, logger watermill.LoggerAdapter) (*TxnPublisher, error) {
	if sub == nil {
		return nil, fieldError("sub", "nil Subscriber")
	}
	// The one late path: sub was built plain. Subscribe reads sub.txn and
	// sub.cfg only after taking lifecycle (see Subscriber.transactional),
	// so they are changed under it, and only before the first Subscribe.
	sub.lifecycle.Lock()
	defer sub.lifecycle.Unlock()
	config, pcfg, err := config.withSubscriber(&sub.cfg)
	switch {
	case err != nil:
		return nil, err
	case sub.txn != nil:
		return nil, fieldError("sub", "already has a TxnPublisher")
	case sub.subscribed:
		return nil, fieldError("sub", "already subscribed: call NewTxnPublisher before Subscribe (or use NewTxnSubscriber)")
	}
	pub := newTxnPublisher(sub, config, pcfg, logger)
	sub.txn = pub
	sub.cfg.OverwriteSaramaConfig = readCommitted(sub.cfg.OverwriteSaramaConfig)
	sub.opts.OverwriteSaramaConfig = sub.cfg.OverwriteSaramaConfig
	return pub, nil
}

// transactional returns the TxnPublisher of s, nil for a plain Subscriber,
// and closes s to NewTxnPublisher: Subscribe calls it before it reads s.cfg.
func (s *Subscriber) transactional() *TxnPublisher {
	s.lifecycle.Lock()
	defer s.lifecycle.Unlock()
	s.subscribed = true
	return s.txn
}

func newTxnPublisher(sub *Subscriber, config TxnConfig, pcfg *sarama.Config, logger watermill.LoggerAdapter) *TxnPublisher {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &TxnPublisher{sub: sub, cfg: config, logger: logger,
		txn: consume.NewTxn(config.TransactionalID, config.CommitInterval, config.Brokers, config.Marshaler, pcfg)}
}

// readCommitted returns a copy of a transactional subscriber's Sarama
// config that reads with IsolationLevel ReadCommitted. Such a consumer
// also fetches committed offsets with RequireStable: it waits for a
// transaction of the partition's previous owner still in flight instead of
// starting below it (Sarama's offset manager does this for ReadCommitted,
// and so does kclient.FetchCommitted). Inputs that are themselves transactional
// outputs are read committed too.
func readCommitted(sc *sarama.Config) *sarama.Config {
	c := *sc
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	return &c
}

// txnFieldError is fieldError for a field of TxnConfig.
func txnFieldError(field, format string, args ...any) error {
	return fieldError("TxnConfig."+field, format, args...)
}

// Validate reports the first invalid field of c that can be judged without
// the subscriber's config; NewTxnSubscriber checks the rest (the
// subscriber's ConsumerGroup and Version, and the producer's Sarama config
// when it is the subscriber's). Each error wraps ErrInvalidConfig and
// names the field, with the prefix "TxnConfig.".
func (c TxnConfig) Validate() error {
	switch {
	case c.TransactionalID == "":
		return txnFieldError("TransactionalID", "required: a name unique among running instances and stable across restarts")
	case c.CommitInterval < 0:
		return txnFieldError("CommitInterval", "negative: %s", c.CommitInterval)
	case c.CommitInterval > 0 && c.CommitInterval < minCommitInterval:
		return txnFieldError("CommitInterval", "%s is below %s: a transaction takes several round trips to the broker, and the commit loop would only spin", c.CommitInterval, minCommitInterval)
	}
	for i, b := range c.Brokers {
		if b == "" {
			return txnFieldError("Brokers", "entry %d is empty", i)
		}
	}
	if c.OverwriteSaramaConfig != nil {
		if _, err := producerConfig(c.OverwriteSaramaConfig, c.TransactionalID, "TxnConfig.OverwriteSaramaConfig"); err != nil {
			return err
		}
	}
	return nil
}

// withSubscriber validates c for a subscriber whose config (defaults
// applied) is sc, and returns c with its defaults, some of them sc's, and
// the producer's Sarama config.
func (c TxnConfig) withSubscriber(sc *SubscriberConfig) (TxnConfig, *sarama.Config, error) {
	if err := c.Validate(); err != nil {
		return c, nil, err
	}
	switch {
	case sc.GroupProtocol == GroupProtocolConsumer:
		return c, nil, fieldError("SubscriberConfig.GroupProtocol", "GroupProtocolConsumer: transactional mode runs on the classic group protocol only (its TxnOffsetCommit is fenced by Sarama's generation)")
	case sc.ConsumerGroup == "":
		return c, nil, fieldError("SubscriberConfig.ConsumerGroup", "required in transactional mode: the offsets committed with the outputs are the group's")
	case !sc.OverwriteSaramaConfig.Version.IsAtLeast(sarama.V2_5_0_0):
		return c, nil, fieldError("SubscriberConfig.OverwriteSaramaConfig.Version", "%s: transactional mode needs 2.5.0 or later (KIP-447: offsets fenced by generation and member id, stable offset fetches)", sc.OverwriteSaramaConfig.Version)
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultTxnCommitInterval
	}
	if c.Marshaler == nil {
		c.Marshaler = kafka.DefaultMarshaler{}
	}
	if len(c.Brokers) == 0 {
		c.Brokers = sc.Brokers
	}
	if c.OverwriteSaramaConfig != nil {
		pcfg, err := producerConfig(c.OverwriteSaramaConfig, c.TransactionalID, "TxnConfig.OverwriteSaramaConfig")
		return c, pcfg, err
	}
	pcfg, err := producerConfig(sc.OverwriteSaramaConfig, c.TransactionalID, "SubscriberConfig.OverwriteSaramaConfig (the producer's, TxnConfig.OverwriteSaramaConfig being nil)")
	return c, pcfg, err
}

// producerConfig returns a copy of base with what a transactional producer
// needs set, or an error naming field (where base comes from) when it
// cannot serve one.
func producerConfig(base *sarama.Config, id, field string) (*sarama.Config, error) {
	if !base.Version.IsAtLeast(sarama.V2_5_0_0) {
		return nil, fieldError(field+".Version", "%s: transactional mode needs 2.5.0 or later", base.Version)
	}
	pcfg := *base
	pcfg.Producer.Idempotent = true
	pcfg.Producer.RequiredAcks = sarama.WaitForAll
	pcfg.Producer.Return.Successes = true
	pcfg.Producer.Return.Errors = true
	pcfg.Net.MaxOpenRequests = 1
	pcfg.Producer.Transaction.ID = id // per topic at Subscribe; validated here
	if err := pcfg.Validate(); err != nil {
		return nil, fieldError(field, "%v", err)
	}
	return &pcfg, nil
}

// Publish buffers msgs as outputs of the delivery each one's context comes
// from (see ErrNoDelivery): they enter a transaction once that delivery is
// acked, and are dropped if it is nacked. It fails with ErrAlreadyAnswered
// once the delivery was acked or nacked.
//
// It marshals the messages now, and refuses, before buffering any of them,
// an output the transaction could never write: one whose record batch would
// be larger than the producer's Producer.MaxMessageBytes (an error wrapping
// sarama.ErrMessageSizeTooLarge), or one to a topic the cluster neither
// has nor creates (sarama.ErrUnknownTopicOrPartition). Such an output would
// fail every transaction it entered, and its record, handled again after
// each abort, would write it again. The error reaches a handler that
// publishes itself, and so Retry and PoisonQueue around it; outputs a
// handler returns are checked the same way by Middleware.
func (p *TxnPublisher) Publish(topic string, msgs ...*message.Message) error {
	if topic == "" {
		return errors.New("safeack: empty topic")
	}
	deliveries := make([]*consume.TxnDelivery, len(msgs))
	records := make([]*sarama.ProducerMessage, len(msgs))
	for i, m := range msgs {
		d, ok := consume.TxnDeliveryFromCtx(m.Context())
		if !ok {
			return ErrNoDelivery
		}
		if d.Publisher() != p.txn {
			return fmt.Errorf("%w: the delivery belongs to another TxnPublisher", ErrNoDelivery)
		}
		pm, err := p.txn.Writable(d, topic, m)
		if err != nil {
			return err
		}
		deliveries[i], records[i] = d, pm
	}
	for i, d := range deliveries {
		if err := d.Add(records[i]); err != nil {
			return err
		}
	}
	return nil
}

// Middleware gives the messages a handler returns the context of the
// message it handled, so that the router's Publish (this TxnPublisher)
// files them under that delivery, and drops the outputs the handler
// published itself or returned when it fails (returns an error or
// panics): a failed attempt's outputs never enter a transaction, even when
// middleware outside it retries the message or dead-letters it and acks.
//
// It also checks the returned messages as Publish will, for the handler's
// publish topic (message.PublishTopicFromCtx), when the router publishes
// them with a TxnPublisher (message.PublisherNameFromCtx): an output no
// transaction could write fails the handler here, where Retry and
// PoisonQueue see the error, instead of failing the router's Publish after
// them, which nacks the message and so handles it again forever.
//
// Add it to every handler whose outputs go through this publisher, inside
// middleware.Retry and PoisonQueue: added last with router.AddMiddleware,
// or as the handler's own middleware (the router runs those inside its
// own). A returned message that already carries a delivery keeps it.
func (p *TxnPublisher) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d, ok := consume.TxnDeliveryFromCtx(msg.Context())
		if !ok || d.Publisher() != p.txn {
			d = nil
		}
		kept := d.Count()
		succeeded := false
		defer func() {
			if !succeeded {
				d.Truncate(kept)
			}
		}()
		out, err := h(msg)
		if err != nil {
			// A failed attempt's returned messages are dropped too: PoisonQueue
			// (and Retry, once exhausted) pass them on with its error turned to
			// nil, and the router would publish them, without a delivery, so
			// ErrNoDelivery nacks the record again forever.
			return nil, err
		}
		// The router publishes the returned messages to topic, with a
		// TxnPublisher only if its name says so.
		topic := message.PublishTopicFromCtx(msg.Context())
		check := topic != "" && message.PublisherNameFromCtx(msg.Context()) == txnPublisherName
		for _, m := range out {
			od, ok := consume.TxnDeliveryFromCtx(m.Context())
			if !ok {
				m.SetContext(msg.Context())
				od = d
			}
			if !check || od == nil || od.Publisher() != p.txn {
				continue // another publisher has it, or Publish refuses it
			}
			if _, err := p.txn.Writable(od, topic, m); err != nil {
				return nil, err
			}
		}
		succeeded = true
		return out, nil
	}
}

// txnPublisherName is what a Router calls a *TxnPublisher
// (message.PublisherNameFromCtx): its type name.
var txnPublisherName = strings.TrimPrefix(fmt.Sprintf("%T", (*TxnPublisher)(nil)), "*")

// Close does nothing: the transactions belong to the Subscriber's
// subscriptions, which commit what is complete and close their producers
// when the Subscriber closes. It is there so that TxnPublisher is a
// message.Publisher a router may close.
func (p *TxnPublisher) Close() error { return nil }

// TxnStats counts the transactions of a TxnPublisher's subscriptions.
type TxnStats struct {
	// Committed and Aborted count transactions.
	Committed, Aborted uint64
	// Retried counts transactions tried again because the coordinator
	// refused their offsets for a generation that had just moved on
	// (cooperative rebalancing only; the second try commits the same
	// outputs and positions with the new generation).
	Retried uint64
	// Abandoned counts transactions given up at Close because the broker
	// did not answer in time. Each is committed or aborted as a whole,
	// outputs and offsets together: left open, the next producer with the
	// same transactional id aborts it, or the broker does after
	// Producer.Transaction.Timeout.
	Abandoned uint64
	// Outputs counts the output records written in committed transactions.
	Outputs uint64
	// AckedDuringCommit counts acked deliveries (with or without outputs)
	// taken while a transaction was committing: handlers are not stopped
	// for a commit, and their outputs go into the next transaction.
	AckedDuringCommit uint64
	// CommitTime is the total time spent writing and committing
	// transactions, and MaxCommit the longest one.
	CommitTime, MaxCommit time.Duration
}

// Stats returns the transaction counters so far.
func (p *TxnPublisher) Stats() TxnStats {
	return TxnStats(p.txn.Stats())
}
