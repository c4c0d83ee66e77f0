package safeack_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Without a consumer group nothing is committed, but a subscription that
// reconnects (here: Sarama shuts a partition consumer down on an
// OFFSET_OUT_OF_RANGE fetch answer) resumes each partition where its
// completed prefix ended, at Sarama's default OffsetNewest: the record
// still unacked when the connection ended is delivered again, so are the
// records written while it reconnected, and nothing of the completed
// prefix is. Before, the reconnect started at OffsetNewest again and lost
// both. When the resume position was deleted meanwhile (retention), the
// partition restarts at the log start, not at its end.
func TestNoGroupReconnectResumesAtTheCompletedPrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		deleteTo  int64 // records below it are deleted before the reconnect; 0: none
		wantAgain []int64
		neverLow  int64 // no record below it is delivered after the reconnect
	}{
		{name: "resume position in the log", wantAgain: []int64{8, 15, 16, 17, 18, 19}, neverLow: 8},
		{name: "resume position deleted", deleteTo: 10, wantAgain: []int64{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, neverLow: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.Start(t)
			c.RequireEmbedded(t)
			topic := c.NewTopic(t, 1)
			c.ProduceN(t, topic, 1, 5, nil) // history, before the subscription: skipped at OffsetNewest

			var failNext atomic.Bool
			kf := c.Kfake()
			kf.ControlKey(kmsg.Fetch.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
				kf.KeepControl()
				freq := req.(*kmsg.FetchRequest)
				if freq.MaxWaitMillis == 0 || !failNext.CompareAndSwap(true, false) {
					return nil, nil, false // the early fetch, or nothing to inject
				}
				resp := freq.ResponseKind().(*kmsg.FetchResponse)
				for _, rt := range freq.Topics {
					st := kmsg.NewFetchResponseTopic()
					st.Topic, st.TopicID = rt.Topic, rt.TopicID
					for _, rp := range rt.Partitions {
						sp := kmsg.NewFetchResponseTopicPartition()
						sp.Partition = rp.Partition
						sp.ErrorCode = kerr.OffsetOutOfRange.Code
						sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = -1, -1, -1
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})

			sub := newTestSubscriber(t, c, "", func(cfg *safeack.SubscriberConfig) {
				cfg.ConsumerGroup = ""
				cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetNewest
				cfg.Ordering = safeack.Unordered // key-less records out at once
				cfg.ReconnectRetrySleep = 500 * time.Millisecond
			})
			msgs := mustSubscribe(t, sub, topic)
			kafkatest.WaitFor(t, 10*time.Second, "the partition to start at the end of its history", func() bool {
				ps, ok := statsOf(sub, topic, 0)
				return ok && ps.SafeOffset == 5
			})

			// 5..14: all acked but 8.
			c.ProduceN(t, topic, 1, 10, nil)
			for range 10 {
				m := receive(t, msgs, 15*time.Second, "no message within 15 s")
				if k, _ := msgPO(m); k.o != 8 {
					m.Ack()
				}
			}
			kafkatest.WaitFor(t, 10*time.Second, "the completed prefix to stop at the unacked record", func() bool {
				ps, ok := statsOf(sub, topic, 0)
				return ok && ps.SafeOffset == 8
			})

			// The connection ends; 15..19 are written before it is back.
			failNext.Store(true)
			kafkatest.WaitFor(t, 10*time.Second, "the partition consumer to be shut down", func() bool {
				_, ok := statsOf(sub, topic, 0)
				return !failNext.Load() && !ok
			})
			c.ProduceN(t, topic, 1, 5, nil)
			if tc.deleteTo > 0 {
				c.DeleteRecords(t, topic, 0, tc.deleteTo)
			}

			want := map[int64]bool{}
			for _, o := range tc.wantAgain {
				want[o] = true
			}
			for len(want) > 0 {
				m := receive(t, msgs, 15*time.Second, "no message within 15 s")
				k, _ := msgPO(m)
				require.GreaterOrEqual(t, k.o, tc.neverLow, "record %d delivered again after the reconnect", k.o)
				delete(want, k.o)
				m.Ack()
			}
		})
	}
}

// Without a consumer group, Close drains as it does with one: a handler
// still running finishes with its context alive (it is not failed, and so
// not dead-lettered by a plain PoisonQueue, because the subscriber is
// closing), and Close returns once it acked, well before DrainTimeout.
// Before, contexts were cancelled at once: nothing is committed without a
// group, so nothing waited.
func TestNoGroupCloseLetsRunningHandlersFinish(t *testing.T) {
	t.Parallel()
	const (
		drainTimeout = 5 * time.Second
		work         = 300 * time.Millisecond // left when Close starts
	)
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	sub := newTestSubscriber(t, c, "", func(cfg *safeack.SubscriberConfig) {
		cfg.ConsumerGroup = ""
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
		cfg.DrainTimeout = drainTimeout
	})
	msgs := mustSubscribe(t, sub, topic)
	c.ProduceN(t, topic, 1, 1, nil)
	m := receive(t, msgs, 15*time.Second, "no message within 15 s")

	closed := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		require.NoError(t, sub.Close())
		closed <- time.Since(start)
	}()
	time.Sleep(work) // the handler's remaining work, not a wait for a condition
	require.NoError(t, m.Context().Err(), "the running handler's context was cancelled by Close")
	m.Ack()
	select {
	case took := <-closed:
		require.GreaterOrEqual(t, took, work, "Close returned before the running handler acked")
		require.Less(t, took, drainTimeout, "Close waited out DrainTimeout after every handler acked")
	case <-time.After(drainTimeout + 5*time.Second):
		t.Fatal("Close did not return")
	}
	_, open := <-msgs
	require.False(t, open, "the output channel is open after Close")
}

// TestNoGroupConsumesAddedPartitions: without a consumer group, at
// Sarama's default OffsetNewest, partitions added to the topic while the
// subscription runs are consumed once the subscription sees them (within
// Metadata.RefreshFrequency, as a group notices them), from their first
// record: every record of a partition that did not exist when Subscribe
// returned was written after it. Before, they were never consumed at all
// until a reconnect, which then started them at their end.
func TestNoGroupConsumesAddedPartitions(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	c.ProduceN(t, topic, 1, 5, nil) // history, before the subscription: skipped at OffsetNewest
	c.ForgetProduced(topic, 0, 5)
	acks := newAckLog()
	sub := newTestSubscriber(t, c, "", func(cfg *safeack.SubscriberConfig) {
		cfg.OverwriteSaramaConfig.Metadata.RefreshFrequency = 200 * time.Millisecond
	})
	handleAll(mustSubscribe(t, sub, topic), acks.ack)
	c.Produce(t, topic, records(0, 3)...)
	acks.waitAllAcked(t, c, topic, mwWait)

	c.AddPartitions(t, topic, 3)
	c.Produce(t, topic, append(records(1, 4), records(2, 4)...)...)
	acks.waitAllAcked(t, c, topic, mwWait)
	kafkatest.WaitFor(t, mwWait, "Stats to show every partition", func() bool {
		return len(ownedPartitions(sub, topic)) == 3
	})
	c.Produce(t, topic, append(records(1, 2), records(2, 2)...)...)
	acks.waitAllAcked(t, c, topic, mwWait)
	for k, n := range acks.snapshot() {
		require.Equal(t, 1, n, "record %v handled more than once", k)
	}
}
