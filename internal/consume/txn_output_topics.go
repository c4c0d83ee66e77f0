package consume

import (
	"errors"
	"fmt"
	"math"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/kclient"
)

// What a transaction's output topics allow.
//
// The broker refuses, inside the transaction, an output the producer
// cannot tell it would refuse: a record batch above the topic's
// max.message.bytes (Sarama fills a partition's batch up to
// Producer.MaxMessageBytes), or a topic the producer's principal may not
// write to (an ACL). Such an output fails every transaction that carries
// it: the record is handled again, writes it again, and the subscription
// never commits again. So the committer asks the cluster about each output
// topic on its first output; Publish refuses an output that could never be
// written (the handler fails, where Retry and PoisonQueue see it), and a
// transaction sends a topic's outputs in rounds whose batches fit it.

const maxMessageBytesConfig = "max.message.bytes"

// outputTopic is what the cluster says of an output topic.
type outputTopic struct {
	maxMessageBytes int   // 0: not readable (no DescribeConfigs permission)
	notWritable     error // the producer may not write to it
}

// outputTopic returns what the cluster says of topic, asked on first use:
// once, however many handlers publish to the topic before the answer
// comes (a router's first outputs asked once each: 64 identical lookups,
// and as many log lines when the config could not be read).
func (c *txnCommitter) outputTopic(topic string) outputTopic {
	if ot, ok := c.topics.get(topic); ok {
		return ot
	}
	v, _, _ := c.lookups.Do(topic, func() (any, error) {
		if ot, ok := c.topics.get(topic); ok {
			return ot, nil // answered while this call waited to start
		}
		limit, err := kclient.DescribeIntConfig(c.client, sarama.TopicResource, topic, maxMessageBytesConfig)
		if err != nil {
			c.sub.logger.Info("Cannot read an output topic's "+maxMessageBytesConfig+"; its outputs are batched up to Producer.MaxMessageBytes",
				c.sub.logFields.Add(watermill.LogFields{"output_topic": topic, "err": err.Error()}))
			limit = 0
		}
		ot := outputTopic{maxMessageBytes: limit, notWritable: c.writeRefused(topic)}
		c.topics.set(topic, ot)
		return ot, nil
	})
	return v.(outputTopic)
}

// writeRefused asks the cluster whether the producer may write to topic
// (Metadata with the topic's authorized operations, Kafka 2.3 and later),
// and returns an error wrapping sarama.ErrTopicAuthorizationFailed if it
// may not. An answer that does not tell (an older broker, a failed
// request) is taken as yes: the transaction will tell.
func (c *txnCommitter) writeRefused(topic string) error {
	req := sarama.NewMetadataRequest(c.client.Config().Version, []string{topic})
	if req.Version < 8 {
		return nil
	}
	req.IncludeTopicAuthorizedOperations = true
	b := c.client.LeastLoadedBroker()
	if b == nil {
		return nil
	}
	_ = b.Open(c.client.Config()) // already open, or connects for the request
	resp, err := b.GetMetadata(req)
	if err != nil {
		return nil
	}
	for _, tm := range resp.Topics {
		if tm.Name != topic {
			continue
		}
		ops := tm.TopicAuthorizedOperations
		switch {
		case errors.Is(tm.Err, sarama.ErrTopicAuthorizationFailed):
			return fmt.Errorf("safeack: output topic %q: %w", topic, sarama.ErrTopicAuthorizationFailed)
		case ops != math.MinInt32 && ops&(1<<sarama.AclOperationWrite) == 0:
			return fmt.Errorf("safeack: output topic %q: the producer's principal may not write to it (no WRITE in its ACLs): %w", topic, sarama.ErrTopicAuthorizationFailed)
		}
	}
	return nil
}

// forgetRefusedTopics drops what was learned of the topics a failed
// transaction's outputs were refused by as too large or not authorized
// (the topic's settings or ACLs changed, or could not be read): Publish
// asks again.
func (c *txnCommitter) forgetRefusedTopics(err error) {
	var perrs sarama.ProducerErrors
	if !errors.As(err, &perrs) {
		return
	}
	for _, pe := range perrs {
		if pe.Msg != nil && (errors.Is(pe.Err, sarama.ErrMessageSizeTooLarge) || errors.Is(pe.Err, sarama.ErrTopicAuthorizationFailed)) {
			c.topics.delete(pe.Msg.Topic)
		}
	}
}

// outputRounds splits a transaction's outputs into rounds, each sent once
// the one before is acknowledged, so that no batch Sarama builds is above
// its topic's limit. Sarama fills a partition's batch while the sum of its
// records' ByteSize (an upper bound of their size in the batch) stays below
// Producer.MaxMessageBytes, plus the batch header: a topic whose limit is
// below that gets its outputs in runs of at most limit minus the header
// bytes, one run per round. The other outputs go in the first round.
// Outputs keep their order within a topic.
func (c *txnCommitter) outputRounds(outputs []*sarama.ProducerMessage) [][]*sarama.ProducerMessage {
	batchMax := c.pub.pcfg.Producer.MaxMessageBytes - 1 + recordBatchHeader
	budget := func(topic string) int {
		if ot, _ := c.topics.get(topic); ot.maxMessageBytes > 0 && ot.maxMessageBytes < batchMax {
			return ot.maxMessageBytes - recordBatchHeader
		}
		return 0 // Sarama's own batches fit
	}
	split := false
	for _, m := range outputs {
		if budget(m.Topic) > 0 {
			split = true
			break
		}
	}
	if !split {
		return [][]*sarama.ProducerMessage{outputs}
	}
	type run struct{ round, bytes int }
	runs := make(map[string]*run)
	var rounds [][]*sarama.ProducerMessage
	for _, m := range outputs {
		round := 0
		if b := budget(m.Topic); b > 0 {
			r := runs[m.Topic]
			size := m.ByteSize(recordBatchVersion)
			switch {
			case r == nil:
				r = &run{}
				runs[m.Topic] = r
			case r.bytes+size > b:
				r.round, r.bytes = r.round+1, 0
			}
			r.bytes += size
			round = r.round
		}
		for len(rounds) <= round {
			rounds = append(rounds, nil)
		}
		rounds[round] = append(rounds[round], m)
	}
	return rounds
}

// produceError adds to an error of SyncProducer.SendMessages the cause of
// its first failed output: Sarama's own says only how many failed.
func produceError(err error) error {
	var perrs sarama.ProducerErrors
	if errors.As(err, &perrs) && len(perrs) > 0 && perrs[0].Msg != nil {
		return fmt.Errorf("%w (the first to %q: %w)", err, perrs[0].Msg.Topic, perrs[0].Err)
	}
	return err
}
