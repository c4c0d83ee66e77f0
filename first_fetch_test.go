package safeack_test

import (
	"fmt"
	"maps"
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

// TestFirstRecordsBeforeSaramasFirstFetch: a session's first records are
// handed out from safeack's own early fetch, without waiting for Sarama's
// first fetch (which Sarama holds back 100 ms, and the broker here until
// the test lets it go). Sarama's copies of them are dropped: every record is
// delivered once, the ones produced later come through Sarama, and the
// commits reach the end. One partition resumes from a commit, the other
// starts at OffsetOldest with an aborted transaction (its records are
// delivered at ReadUncommitted, as Sarama delivers them; its marker is not).
func TestFirstRecordsBeforeSaramasFirstFetch(t *testing.T) {
	skipOnConsumerProtocol(t, "Sarama's early first fetch")
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
	want := map[po]int{}
	next := c.ProduceAborted(t, topic, 1, 3)
	for o := range next - 1 { // the last offset is the abort marker
		want[po{1, o}] = 1
	}
	for _, r := range c.ProduceN(t, topic, 2, 20, func(i int) string { return fmt.Sprint(i % 3) }) {
		if r.Partition == 1 || r.Offset >= 4 {
			want[po{r.Partition, r.Offset}] = 1
		}
	}
	c.CommitOffset(t, group, topic, 0, 4) // 0..3 handled by an earlier member

	release := make(chan struct{})
	var held atomic.Int32
	kf := c.Kfake()
	kf.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if req.(*kmsg.FetchRequest).MaxWaitMillis > 0 { // Sarama's consumer; the early fetch waits for nothing
			held.Add(1)
			kf.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})

	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	})
	acks := newAckLog()
	handleAll(mustSubscribe(t, sub, topic), acks.ack)
	kafkatest.WaitFor(t, 20*time.Second, "the first records delivered while Sarama's fetch is held", func() bool {
		return maps.Equal(acks.snapshot(), want)
	})
	kafkatest.WaitFor(t, 20*time.Second, "their commit", func() bool {
		got := c.CommittedOffsets(t, group, topic)
		return got[0].Offset == 10 && got[1].Offset == 14
	})
	t.Logf("Sarama fetches held meanwhile: %d", held.Load())

	close(release)
	for _, r := range c.ProduceN(t, topic, 2, 10, nil) {
		want[po{r.Partition, r.Offset}] = 1
	}
	kafkatest.WaitFor(t, 20*time.Second, "every record delivered once", func() bool {
		return maps.Equal(acks.snapshot(), want)
	})
	kafkatest.WaitFor(t, 20*time.Second, "the commit of the end", func() bool {
		got := c.CommittedOffsets(t, group, topic)
		return got[0].Offset == 15 && got[1].Offset == 19
	})
	require.Equal(t, want, acks.snapshot(), "no record delivered twice")
	require.Empty(t, acks.badMessages())
}

// stampInterceptor is a Sarama consumer interceptor that adds a header to
// every record it sees.
type stampInterceptor struct{}

func (stampInterceptor) OnConsume(m *sarama.ConsumerMessage) {
	m.Headers = append(m.Headers, &sarama.RecordHeader{Key: []byte("intercepted"), Value: []byte("yes")})
}

// TestFirstRecordsKeepSaramaInterceptors: with Consumer.Interceptors every
// delivered record went through them, the first ones too (the early fetch
// is off: the interceptors see records on the claim).
func TestFirstRecordsKeepSaramaInterceptors(t *testing.T) {
	skipOnConsumerProtocol(t, "Sarama's consumer interceptors, refused with GroupProtocolConsumer")
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 2)
	const n = 20
	c.ProduceN(t, topic, 2, n, nil)
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
		cfg.OverwriteSaramaConfig.Consumer.Interceptors = []sarama.ConsumerInterceptor{stampInterceptor{}}
	})
	var seen, stamped atomic.Int32
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		if m.Metadata.Get("intercepted") == "yes" {
			stamped.Add(1)
		}
		seen.Add(1)
		m.Ack()
	})
	kafkatest.WaitFor(t, 20*time.Second, "every record delivered", func() bool { return seen.Load() >= n })
	require.Equal(t, seen.Load(), stamped.Load(), "records delivered without passing Sarama's interceptors")
}
