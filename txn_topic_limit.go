package safeack

import (
	"errors"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
)

// Output topics' max.message.bytes.
//
// A broker refuses a record batch above its topic's max.message.bytes,
// which the producer does not know: Sarama fills a partition's batch up to
// Producer.MaxMessageBytes. Outputs to a topic with a lower limit would
// fail every transaction that batched enough of them, and the records
// would be handled again and their outputs refused again, forever. So the
// committer reads each output topic's limit on first use, Publish refuses
// an output that could never fit alone (the handler fails, where Retry and
// PoisonQueue see it), and a transaction sends a topic's outputs in rounds
// whose batches fit it.

const maxMessageBytesConfig = "max.message.bytes"

// forgetRefusedLimits drops the limits of the topics a failed
// transaction's outputs were refused by as too large (the topic's setting
// was lowered, or could not be read): Publish reads them again.
func (c *txnCommitter) forgetRefusedLimits(err error) {
	var perrs sarama.ProducerErrors
	if !errors.As(err, &perrs) {
		return
	}
	for _, pe := range perrs {
		if errors.Is(pe.Err, sarama.ErrMessageSizeTooLarge) && pe.Msg != nil {
			c.limits.delete(pe.Msg.Topic)
		}
	}
}

// topicLimit returns an output topic's max.message.bytes, read from the
// cluster on first use; 0 when it cannot be read (no DescribeConfigs
// permission): outputs are then batched as the producer's settings allow.
func (c *txnCommitter) topicLimit(topic string) int {
	if limit, known := c.limits.get(topic); known {
		return limit
	}
	limit, err := describeIntConfig(c.client, sarama.TopicResource, topic, maxMessageBytesConfig)
	if err != nil {
		c.sub.logger.Info("Cannot read an output topic's "+maxMessageBytesConfig+"; its outputs are batched up to Producer.MaxMessageBytes",
			c.sub.logFields.Add(watermill.LogFields{"output_topic": topic, "err": err.Error()}))
		limit = 0
	}
	c.limits.set(topic, limit)
	return limit
}

// outputLimit is the most bytes a record batch holding one output to
// topic may take: the producer's Producer.MaxMessageBytes, or the topic's
// max.message.bytes when that is lower.
func (c *txnCommitter) outputLimit(topic string) int {
	limit := c.pub.pcfg.Producer.MaxMessageBytes
	if tl := c.topicLimit(topic); tl > 0 && tl < limit {
		limit = tl
	}
	return limit
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
		if tl, _ := c.limits.get(topic); tl > 0 && tl < batchMax {
			return tl - recordBatchHeader
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
