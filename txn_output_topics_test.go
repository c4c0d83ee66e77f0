package safeack_test

import (
	"bytes"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
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

// A router's first outputs, from MaxInFlight handlers at once, ask the
// cluster about their output topic once (DescribeConfigs, counted at the
// broker while it is slow to answer), not once per handler: before, each
// output published before the first answer came asked again (64 identical
// lookups, and 64 log lines where the config could not be read).
func TestTxnOutputTopicAskedOnce(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Embedded())
	r := newTxnRig(t, c, 1, 300)
	kf := c.Kfake()
	var asked atomic.Int32
	kf.ControlKey(kmsg.DescribeConfigs.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		for _, res := range req.(*kmsg.DescribeConfigsRequest).Resources {
			if res.ResourceName == r.out {
				asked.Add(1)
				// Slow to answer: every handler publishes meanwhile.
				kf.SleepControl(func() { time.Sleep(300 * time.Millisecond) })
			}
		}
		return nil, nil, false
	})
	sub, pub := r.subscriber(t, "txn-asked-once", func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cfg.MaxInFlight = 64
	})
	var att attempts
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	runRouter(t, r, sub, pub, transform(&att, time.Millisecond))
	r.requireExactlyOnce(t, rd, r.inputIDs(), 60*time.Second, 30*time.Second)
	require.Equal(t, int32(1), asked.Load(), "DescribeConfigs requests for the output topic")
}
