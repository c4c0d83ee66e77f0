package safeack_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// silentBroker accepts TCP connections and never answers: a broker that
// is up but hangs, or a port behind a firewall that drops replies.
func silentBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// unreachableConfig is a subscriber config for brokers, with Sarama's
// retries short enough for a test.
func unreachableConfig(brokers []string, group string) safeack.SubscriberConfig {
	sc := safeack.DefaultSaramaSubscriberConfig()
	sc.Metadata.Retry.Max = 2
	sc.Metadata.Retry.Backoff = 50 * time.Millisecond
	sc.Net.DialTimeout = time.Second
	sc.Net.ReadTimeout = 300 * time.Millisecond
	return safeack.SubscriberConfig{Brokers: brokers, ConsumerGroup: group, OverwriteSaramaConfig: sc}
}

// TestSubscribeUnreachableBroker: Subscribe fails with a clear error when
// no broker can be reached, with or without a consumer group and whether
// or not Sarama fetches full metadata, in the time Sarama's config allows;
// it gives up early when its context ends or the Subscriber is closed.
func TestSubscribeUnreachableBroker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		group    string
		noFullMD bool
	}{
		{name: "group", group: "g"},
		{name: "no-group"},
		{name: "group-without-full-metadata", group: "g", noFullMD: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := unreachableConfig([]string{"127.0.0.1:1"}, tc.group)
			cfg.OverwriteSaramaConfig.Metadata.Full = !tc.noFullMD
			sub, err := safeack.NewSubscriber(cfg, testLogger())
			require.NoError(t, err)
			defer sub.Close()
			start := time.Now()
			msgs, err := sub.Subscribe(context.Background(), "orders")
			took := time.Since(start)
			require.Error(t, err)
			require.Nil(t, msgs)
			t.Logf("Subscribe failed after %v: %v", took.Round(time.Millisecond), err)
			assert.ErrorIs(t, err, sarama.ErrOutOfBrokers)
			assert.ErrorIs(t, err, syscall.ECONNREFUSED)
			assert.Contains(t, err.Error(), "orders")
			assert.Contains(t, err.Error(), "127.0.0.1:1")
			// Two retries 50 ms apart: far below Sarama's defaults.
			assert.Less(t, took, 5*time.Second)
			assert.ErrorIs(t, sub.Ready(), safeack.ErrNotReady)
		})
	}

	t.Run("silent-broker-honours-read-timeout", func(t *testing.T) {
		t.Parallel()
		cfg := unreachableConfig([]string{silentBroker(t)}, "g")
		cfg.OverwriteSaramaConfig.Metadata.Retry.Max = 0
		sub, err := safeack.NewSubscriber(cfg, testLogger())
		require.NoError(t, err)
		defer sub.Close()
		start := time.Now()
		_, err = sub.Subscribe(context.Background(), "orders")
		took := time.Since(start)
		require.Error(t, err)
		t.Logf("Subscribe failed after %v: %v", took.Round(time.Millisecond), err)
		var ne net.Error
		require.ErrorAs(t, err, &ne)
		assert.True(t, ne.Timeout(), "not a timeout: %v", err)
		assert.GreaterOrEqual(t, took, cfg.OverwriteSaramaConfig.Net.ReadTimeout)
		assert.Less(t, took, 5*time.Second)
	})

	t.Run("context-ends-first", func(t *testing.T) {
		t.Parallel()
		sub := silentSubscriber(t)
		defer sub.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := sub.Subscribe(ctx, "orders")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Less(t, time.Since(start), 10*time.Second)
	})

	t.Run("closed-meanwhile", func(t *testing.T) {
		t.Parallel()
		sub := silentSubscriber(t)
		errs := make(chan error, 1)
		go func() {
			_, err := sub.Subscribe(context.Background(), "orders")
			errs <- err
		}()
		time.Sleep(100 * time.Millisecond) // let Subscribe start connecting
		require.NoError(t, sub.Close())
		select {
		case err := <-errs:
			require.ErrorIs(t, err, safeack.ErrSubscriberClosed)
		case <-time.After(10 * time.Second):
			t.Fatal("Subscribe did not return after Close")
		}
	})
}

// TestSubscriberReady: Ready reports not ready before Subscribe and while
// the group is being joined, ready once the member has its assignment
// (also an empty one), and not ready again once the broker went away.
func TestSubscriberReady(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())

	// Hold every join until released (JoinGroup, or the consumer
	// protocol's ConsumerGroupHeartbeat): the member stays joining.
	release := make(chan struct{})
	kf := c.Kfake()
	join := kmsg.JoinGroup
	if envGroupProtocol == safeack.GroupProtocolConsumer {
		join = kmsg.ConsumerGroupHeartbeat
	}
	kf.ControlKey(join.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		kf.SleepControl(func() { <-release })
		return nil, nil, false
	})

	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		// Few retries: once the broker is gone, Close waits for Sarama's
		// calls in progress (a commit, an offset read) to give up.
		cfg.OverwriteSaramaConfig.Metadata.Retry.Max = 1
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Retry.Max = 1
	})
	require.ErrorIs(t, sub.Ready(), safeack.ErrNotReady, "ready before any Subscribe")
	msgs := mustSubscribe(t, sub, topic)
	handleAll(msgs, func(m *message.Message) { m.Ack() })
	err := sub.Ready()
	require.ErrorIs(t, err, safeack.ErrNotReady, "ready while the JoinGroup is held")
	assert.Contains(t, err.Error(), "joining consumer group")
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, sub.WaitReady(short), context.DeadlineExceeded)

	close(release)
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	require.NoError(t, sub.WaitReady(ctx))
	require.NoError(t, sub.Ready())
	t.Logf("%v: ready", time.Now().Format("15:04:05.000"))
	// Ready comes with the session's Setup; the partitions' workers start
	// right after it.
	kafkatest.WaitFor(t, 5*time.Second, "the assigned partitions in Stats", func() bool {
		return len(ownedPartitions(sub, topic)) == 2
	})

	// A second member of a group with more members than partitions is
	// ready with whatever it got, possibly nothing.
	topic1 := c.NewTopic(t, 1)
	group1 := c.NewGroup(t)
	m1 := newTestSubscriber(t, c, group1, nil)
	m2 := newTestSubscriber(t, c, group1, nil)
	handleAll(mustSubscribe(t, m1, topic1), func(m *message.Message) { m.Ack() })
	handleAll(mustSubscribe(t, m2, topic1), func(m *message.Message) { m.Ack() })
	require.NoError(t, m1.WaitReady(ctx))
	require.NoError(t, m2.WaitReady(ctx))
	kafkatest.WaitFor(t, 20*time.Second, "the partition to be owned by one member", func() bool {
		return len(ownedPartitions(m1, topic1))+len(ownedPartitions(m2, topic1)) == 1
	})
	require.NoError(t, m1.Ready())
	require.NoError(t, m2.Ready())
	require.NoError(t, m1.Close())
	require.NoError(t, m2.Close())
	t.Logf("%v: group of two closed", time.Now().Format("15:04:05.000"))

	// Without a consumer group: ready once connected.
	solo := newTestSubscriber(t, c, "", nil)
	handleAll(mustSubscribe(t, solo, topic1), func(m *message.Message) { m.Ack() })
	require.NoError(t, solo.WaitReady(ctx))
	require.NoError(t, solo.Close())
	t.Logf("%v: no-group closed", time.Now().Format("15:04:05.000"))

	// The broker goes away: the session ends and Ready says so.
	kf.Close()
	kafkatest.WaitFor(t, 30*time.Second, "Ready to report the lost broker", func() bool {
		return errors.Is(sub.Ready(), safeack.ErrNotReady)
	})
	t.Logf("after the broker went away: %v", sub.Ready())
	kafkatest.WaitFor(t, 30*time.Second, "Ready to report the failed reconnection", func() bool {
		err := sub.Ready()
		return err != nil && strings.Contains(err.Error(), "reconnecting after")
	})
	t.Logf("then: %v", sub.Ready())

	closeStart := time.Now()
	require.NoError(t, sub.Close())
	t.Logf("Close after the broker went away took %v", time.Since(closeStart))
	require.ErrorIs(t, sub.Ready(), safeack.ErrSubscriberClosed)
	require.ErrorIs(t, sub.WaitReady(context.Background()), safeack.ErrSubscriberClosed)
}

// TestSubscribeTailBudgetAboveBrokerLimit: a TailMetadataBudget set above
// the coordinator's offset.metadata.max.bytes fails Subscribe (every commit
// would be rejected); within it, left at its default (lowered to the
// limit, see TestDefaultTailBudgetFollowsBrokerLimit), with the tail
// disabled, or without a consumer group, Subscribe goes on; a broker that
// does not report the setting is not judged.
func TestSubscribeTailBudgetAboveBrokerLimit(t *testing.T) {
	t.Parallel()
	const limit = 1024
	c := kafkatest.Start(t, kafkatest.WithKfakeOpts(kfake.BrokerConfigs(map[string]string{
		"offset.metadata.max.bytes": strconv.Itoa(limit),
	})))
	c.RequireEmbedded(t)
	topic := c.NewTopic(t, 1)

	sub := newTestSubscriber(t, c, c.NewGroup(t), func(cfg *safeack.SubscriberConfig) {
		cfg.TailMetadataBudget = frontier.DefaultMetadataBudget // 4096, set
	})
	_, err := sub.Subscribe(context.Background(), topic)
	require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "TailMetadataBudget")
	assert.Contains(t, err.Error(), "offset.metadata.max.bytes (1024)")
	require.ErrorIs(t, sub.Ready(), safeack.ErrNotReady)

	for name, mod := range map[string]func(*safeack.SubscriberConfig){
		"within":        func(cfg *safeack.SubscriberConfig) { cfg.TailMetadataBudget = limit },
		"default":       func(cfg *safeack.SubscriberConfig) { cfg.TailMetadataBudget = 0 },
		"tail-disabled": func(cfg *safeack.SubscriberConfig) { cfg.DisableCompletedTail = true },
		"no-group":      func(cfg *safeack.SubscriberConfig) { cfg.ConsumerGroup = "" },
	} {
		sub := newTestSubscriber(t, c, c.NewGroup(t), mod)
		_, err := sub.Subscribe(context.Background(), topic)
		require.NoError(t, err, name)
		require.NoError(t, sub.Close(), name)
	}

	// kfake does not report the setting unless configured: not judged.
	plain := kafkatest.Start(t)
	plainTopic := plain.NewTopic(t, 1)
	sub = newTestSubscriber(t, plain, plain.NewGroup(t), func(cfg *safeack.SubscriberConfig) {
		cfg.TailMetadataBudget = 64 << 10
	})
	_, err = sub.Subscribe(context.Background(), plainTopic)
	require.NoError(t, err)
}

// TestDefaultTailBudgetFollowsBrokerLimit: left at its default, the tail
// budget is lowered to a coordinator's offset.metadata.max.bytes below it,
// so Subscribe goes on and the completed tail is cut to that limit. Before,
// Subscribe failed with ErrInvalidConfig for a budget the user never set.
func TestDefaultTailBudgetFollowsBrokerLimit(t *testing.T) {
	t.Parallel()
	const limit, n = 1024, 12_000
	c := kafkatest.Start(t, kafkatest.WithKfakeOpts(kfake.BrokerConfigs(map[string]string{
		"offset.metadata.max.bytes": strconv.Itoa(limit),
	})))
	c.RequireEmbedded(t)
	topic := c.NewTopic(t, 1)
	produceSequential(t, c, topic, 0, n)
	sub := tailSubscriber(t, c.Brokers(), c.SaramaConfig(), c.NewGroup(t), func(cfg *safeack.SubscriberConfig) {
		cfg.MaxInFlight = n
	})
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)

	// Hold record 0 and a random half of the others: a tail of about
	// 2,000 bytes, within the default 4096 but above the broker's limit.
	rng := rand.New(rand.NewPCG(3, 4))
	var held []*message.Message
	var handled atomic.Int64
	go func() {
		for msg := range msgs {
			handled.Add(1)
			if off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context()); off == 0 || rng.IntN(2) == 0 {
				held = append(held, msg)
				continue
			}
			msg.Ack()
		}
	}()
	kafkatest.WaitFor(t, 20*time.Second, "every record handed out", func() bool { return handled.Load() == n })
	kafkatest.WaitFor(t, 5*time.Second, "a tail cut to the broker's limit", func() bool {
		st := sub.Stats()[0]
		return st.TailTruncated && st.TailBytes > 0 && st.TailBytes <= limit
	})
}

// TestMissingTopicLoggedAsError: a consumer group subscription to a topic
// the cluster does not have logs an Error at once and keeps retrying, as
// watermill-kafka does. Before, the failed join was taken for a group
// coordinator on the move: retried with the same member at Info for twice
// the session timeout, the first Error about 20 s later.
func TestMissingTopicLoggedAsError(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	if c.AutoCreatesTopics(t) {
		t.Skip("the cluster creates a topic its metadata is asked for (auto.create.topics.enable)")
	}
	logger := watermill.NewCaptureLogger()
	cfg := safeack.SubscriberConfig{Brokers: c.Brokers(), ConsumerGroup: c.NewGroup(t), WaitForTopicCreationTimeout: 50 * time.Millisecond}
	sub, err := safeack.NewSubscriber(cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	missing := "missing-" + c.NewGroup(t)
	if _, err := sub.Subscribe(context.Background(), missing); err != nil {
		require.ErrorIs(t, err, sarama.ErrUnknownTopicOrPartition) // refused at once: as good
		return
	}
	kafkatest.WaitFor(t, 5*time.Second, "an Error naming the missing topic", func() bool {
		for _, m := range logger.Captured()[watermill.ErrorLogLevel] {
			if errors.Is(m.Err, sarama.ErrUnknownTopicOrPartition) && m.Fields["topic"] == missing {
				return true
			}
		}
		return false
	})
	require.ErrorIs(t, sub.Ready(), safeack.ErrNotReady)
}

// silentSubscriber is a Subscriber (group "g") whose only broker accepts
// connections and never answers, with a read timeout of a minute.
func silentSubscriber(t *testing.T) *safeack.Subscriber {
	t.Helper()
	cfg := unreachableConfig([]string{silentBroker(t)}, "g")
	cfg.OverwriteSaramaConfig.Net.ReadTimeout = time.Minute
	sub, err := safeack.NewSubscriber(cfg, testLogger())
	require.NoError(t, err)
	return sub
}
