package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/metrics"
)

// TestAdvCollectorTwoSubscriptionsOfOneTopic: without a consumer group, a
// router with two handlers on one topic subscribes one Subscriber to it
// twice, and each subscription owns every partition. A registry gathering
// the Collector must still succeed: no two series with the same name and
// labels.
func TestAdvCollectorTwoSubscriptionsOfOneTopic(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 2)
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               c.Brokers(),
		OverwriteSaramaConfig: c.SaramaConfig(),
	}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for range 2 {
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		go func() {
			for m := range msgs {
				m.Ack()
			}
		}()
	}
	kafkatest.WaitFor(t, 15*time.Second, "both subscriptions to own both partitions", func() bool {
		return len(sub.Stats()) == 4
	})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(metrics.NewCollector(sub)))
	_, err = reg.Gather()
	require.NoError(t, err)
}
