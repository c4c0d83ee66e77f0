package consume

import (
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/internal/sentinel"
)

// Txn is the side of a TxnPublisher that its Subscriber's transactional
// committers share: the transactional settings, the topics subscribed
// (one transactional id each), the counters, and the check of an output
// before it is buffered.
type Txn struct {
	TransactionalID string
	CommitInterval  time.Duration
	Brokers         []string
	Marshaler       kafka.Marshaler
	pcfg            *sarama.Config // the producer's, with the transactional settings

	mu     sync.Mutex
	topics map[string]bool // subscribed topics: one transactional id each
	stats  TxnStats
}

// NewTxn returns the shared side of a TxnPublisher whose producer is
// configured with pcfg.
func NewTxn(id string, interval time.Duration, brokers []string, marshaler kafka.Marshaler, pcfg *sarama.Config) *Txn {
	return &Txn{TransactionalID: id, CommitInterval: interval, Brokers: brokers, Marshaler: marshaler, pcfg: pcfg, topics: make(map[string]bool)}
}

// TxnStats counts the transactions of a TxnPublisher's subscriptions: the
// public TxnStats, field for field.
type TxnStats struct {
	Committed, Aborted    uint64
	Retried               uint64
	Abandoned             uint64
	Outputs               uint64
	AckedDuringCommit     uint64
	CommitTime, MaxCommit time.Duration
}

// Stats returns the transaction counters so far.
func (p *Txn) Stats() TxnStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// recordBatchVersion is the record format of the producer's Kafka versions
// (0.11 and later; transactional mode needs 2.5.0).
const recordBatchVersion = 2

func usesCooperative(sc *sarama.Config) bool {
	r := sc.Consumer.Group.Rebalance
	if r.Strategy != nil && r.Strategy.Name() == sarama.CooperativeStickyBalanceStrategyName {
		return true
	}
	for _, s := range r.GroupStrategies {
		if s.Name() == sarama.CooperativeStickyBalanceStrategyName {
			return true
		}
	}
	return false
}

// Writable marshals m as an output to topic of delivery d, and refuses it
// if no transaction could ever write it: a record batch of it alone above
// the producer's Producer.MaxMessageBytes or the topic's max.message.bytes,
// or a topic the cluster neither has nor creates, or the producer may not
// write to.
func (p *Txn) Writable(d *TxnDelivery, topic string, m *message.Message) (*sarama.ProducerMessage, error) {
	pm, err := p.Marshaler.Marshal(topic, m)
	if err != nil {
		return nil, fmt.Errorf("safeack: marshaling output %s: %w", m.UUID, err)
	}
	ot, err := d.committer.checkTopic(topic)
	if err != nil {
		return nil, err
	}
	// A record alone in its batch must fit the broker's limit too, which
	// counts the batch header: Sarama's own check does not.
	if size, limit := recordBatchHeader+pm.ByteSize(recordBatchVersion), p.outputLimit(ot); size > limit {
		return nil, fmt.Errorf("safeack: output %s to %q takes up to %d bytes in a record batch, above %s (%d): %w",
			m.UUID, topic, size, p.limitName(limit), limit, sarama.ErrMessageSizeTooLarge)
	}
	return pm, nil
}

// limitName names the setting an output limit comes from.
func (p *Txn) limitName(limit int) string {
	if limit < p.pcfg.Producer.MaxMessageBytes {
		return "the topic's " + maxMessageBytesConfig
	}
	return "Producer.MaxMessageBytes"
}

func (p *Txn) count(f func(*TxnStats)) {
	p.mu.Lock()
	f(&p.stats)
	p.mu.Unlock()
}

// claimTopic reserves topic's transactional id for one subscription.
func (p *Txn) claimTopic(topic string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.topics[topic] {
		return fmt.Errorf("%w: topic %q is already subscribed in transactional mode (one transactional id per topic)", sentinel.ErrInvalidConfig, topic)
	}
	p.topics[topic] = true
	return nil
}

func (p *Txn) releaseTopic(topic string) {
	p.mu.Lock()
	delete(p.topics, topic)
	p.mu.Unlock()
}

// outputLimit is the most bytes a record batch holding one output to
// topic ot may take: the producer's Producer.MaxMessageBytes, or the
// topic's max.message.bytes when that is lower.
func (p *Txn) outputLimit(ot outputTopic) int {
	limit := p.pcfg.Producer.MaxMessageBytes
	if tl := ot.maxMessageBytes; tl > 0 && tl < limit {
		limit = tl
	}
	return limit
}

// recordBatchHeader is the size of a record batch's header (base offset,
// length, and the rest), which a broker's max.message.bytes counts.
const recordBatchHeader = 61
