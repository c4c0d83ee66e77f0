package safeack_test

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/internal/kafkatest"
)

// An output topic whose max.message.bytes is below the producer's
// Producer.MaxMessageBytes: the broker refuses any record batch above the
// topic's limit, which Sarama knows nothing of. Outputs that fit one at a
// time are all written, exactly once, however many one transaction carries
// (they go in batches the topic accepts), and an output that could never
// fit is refused by Publish, so the handler's error reaches PoisonQueue and
// the input is dead-lettered. Before, Sarama batched the outputs up to its
// own limit, the broker refused the batch (MESSAGE_TOO_LARGE), and every
// transaction that carried them aborted: the records were handled again,
// the same batch was refused again, and the subscription never committed.
func TestTxnOutputTopicLimit(t *testing.T) {
	t.Parallel()
	const topicLimit = 4096
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 1, "txn-topic-limit")
	out := c.NewTopicWithConfig(t, 1, map[string]string{"max.message.bytes": strconv.Itoa(topicLimit)})
	dlq, poison := d.deadLetters(t)
	refused := make(chan error, 1)
	d.router.AddMiddleware(poison, errorsTo(refused), d.pub.Middleware)
	d.router.AddHandler("h", d.in, d.sub, out, d.pub, func(msg *message.Message) ([]*message.Message, error) {
		size := 1000 // four of them make a batch above the topic's limit
		if string(msg.Payload) == "too large" {
			size = topicLimit
		}
		o := outputFor(msg, "")
		o.Payload = bytes.Repeat([]byte("o"), size)
		return []*message.Message{o}, nil
	})
	d.run(t)
	rd := readOutputs(t, c, out, 1, sarama.ReadCommitted)
	dl := readOutputs(t, c, dlq, 1, sarama.ReadCommitted)

	ids := d.publish(t, "fits", 40)
	d.publish(t, "too large", 1)
	ids = append(ids, d.publish(t, "fits", 40)...)

	d.requireOneDeadLetter(t, rd, dl, out, ids, "the input whose output is above the topic's limit dead-lettered", refused, sarama.ErrMessageSizeTooLarge)
}
