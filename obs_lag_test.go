package safeack_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestLagWhilePaused: a partition whose handler holds its first record has
// its fetching paused once its queue fills; records produced meanwhile still
// show in HighWaterMark and Lag, so a lag alert fires for a partition that
// stopped. Before, both stayed at the last fetch's (282 of 1100 here).
func TestLagWhilePaused(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	held := func(cfg *safeack.SubscriberConfig) { cfg.MaxInFlight = 4 }
	t.Run("group", func(t *testing.T) {
		t.Parallel()
		topic := c.NewTopic(t, 1)
		testLagWhilePaused(t, c, newTestSubscriber(t, c, c.NewGroup(t), held), topic)
	})
	t.Run("no-group", func(t *testing.T) {
		t.Parallel()
		topic := c.NewTopic(t, 1)
		testLagWhilePaused(t, c, newTestSubscriber(t, c, "", held), topic)
	})
	t.Run("txn", func(t *testing.T) {
		t.Parallel()
		r := newTxnRig(t, c, 1, 0)
		sub, _ := r.subscriber(t, "lag-"+r.group, func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) { held(cfg) })
		testLagWhilePaused(t, c, sub, r.in)
	})
}

func testLagWhilePaused(t *testing.T, c *kafkatest.Cluster, sub *safeack.Subscriber, topic string) {
	handleAll(mustSubscribe(t, sub, topic), func(*message.Message) {}) // never acked
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sub.WaitReady(ctx))
	kafkatest.WaitFor(t, 5*time.Second, "the partition in Stats", func() bool {
		_, ok := statsOf(sub, topic, 0)
		return ok
	})
	produceSequential(t, c, topic, 0, 100)
	kafkatest.WaitFor(t, 5*time.Second, "the first records in flight", func() bool {
		st, ok := statsOf(sub, topic, 0)
		return ok && st.InFlight >= 1 && st.HighWaterMark == 100
	})
	produceSequential(t, c, topic, 0, 1000)
	kafkatest.WaitFor(t, 5*time.Second, "the new records in HighWaterMark and Lag", func() bool {
		st, _ := statsOf(sub, topic, 0)
		return st.HighWaterMark == 1100 && st.Lag == 1100
	})
}
