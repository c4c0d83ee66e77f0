package safeack_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestNewSubscriberInvalidConfig: every refused configuration gives an
// error wrapping ErrInvalidConfig that names the field; a nil logger and a
// nil Sarama config are accepted.
func TestNewSubscriberInvalidConfig(t *testing.T) {
	t.Parallel()
	valid := func() safeack.SubscriberConfig {
		return safeack.SubscriberConfig{Brokers: []string{"127.0.0.1:9092"}, ConsumerGroup: "g"}
	}
	saramaWith := func(mod func(*sarama.Config)) *sarama.Config {
		c := safeack.DefaultSaramaSubscriberConfig()
		mod(c)
		return c
	}
	for _, tc := range []struct {
		name  string
		mod   func(*safeack.SubscriberConfig)
		field string
	}{
		{"no brokers", func(c *safeack.SubscriberConfig) { c.Brokers = nil }, "Brokers"},
		{"empty broker list", func(c *safeack.SubscriberConfig) { c.Brokers = []string{} }, "Brokers"},
		{"empty broker string", func(c *safeack.SubscriberConfig) { c.Brokers = []string{"127.0.0.1:9092", ""} }, "Brokers"},
		{"negative MaxInFlight", func(c *safeack.SubscriberConfig) { c.MaxInFlight = -1 }, "MaxInFlight"},
		{"negative MaxPendingPerPartition", func(c *safeack.SubscriberConfig) { c.MaxPendingPerPartition = -5 }, "MaxPendingPerPartition"},
		{"negative DrainTimeout", func(c *safeack.SubscriberConfig) { c.DrainTimeout = -time.Second }, "DrainTimeout"},
		{"negative CommitInterval", func(c *safeack.SubscriberConfig) { c.CommitInterval = -time.Millisecond }, "CommitInterval"},
		{"CommitInterval of a nanosecond", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Consumer.Offsets.AutoCommit.Enable = false })
			c.CommitInterval = time.Nanosecond
		}, "CommitInterval"},
		{"Sarama AutoCommit.Interval of a microsecond", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Consumer.Offsets.AutoCommit.Interval = time.Microsecond })
		}, "AutoCommit.Interval"},
		{"negative NackResendSleep", func(c *safeack.SubscriberConfig) { c.NackResendSleep = -time.Second }, "NackResendSleep"},
		{"negative ReconnectRetrySleep", func(c *safeack.SubscriberConfig) { c.ReconnectRetrySleep = -2 * time.Second }, "ReconnectRetrySleep"},
		{"negative WaitForTopicCreationTimeout", func(c *safeack.SubscriberConfig) { c.WaitForTopicCreationTimeout = -time.Second }, "WaitForTopicCreationTimeout"},
		{"unknown Ordering", func(c *safeack.SubscriberConfig) { c.Ordering = safeack.Ordering(42) }, "Ordering"},
		{"negative Ordering", func(c *safeack.SubscriberConfig) { c.Ordering = safeack.Ordering(-1) }, "Ordering"},
		{"OrderingKey with partition ordering", func(c *safeack.SubscriberConfig) {
			c.Ordering = safeack.OrderByPartition
			c.OrderingKey = func(*sarama.ConsumerMessage) []byte { return nil }
		}, "OrderingKey"},
		{"OrderingKey unordered", func(c *safeack.SubscriberConfig) {
			c.Ordering = safeack.Unordered
			c.OrderingKey = func(*sarama.ConsumerMessage) []byte { return nil }
		}, "OrderingKey"},
		{"Sarama Fetch.Min zero", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Consumer.Fetch.Min = 0 })
		}, "OverwriteSaramaConfig"},
		{"Sarama bad Offsets.Initial", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Consumer.Offsets.Initial = 17 })
		}, "OverwriteSaramaConfig"},
		{"Sarama Version too old for consumer groups", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Version = sarama.V0_10_1_0 })
		}, "OverwriteSaramaConfig.Version"},
		{"negative TailMetadataBudget", func(c *safeack.SubscriberConfig) { c.TailMetadataBudget = -1 }, "TailMetadataBudget"},
		{"PauseAtTailUsage above one", func(c *safeack.SubscriberConfig) { c.PauseAtTailUsage = 1.5 }, "PauseAtTailUsage"},
		{"negative PauseAtTailUsage", func(c *safeack.SubscriberConfig) { c.PauseAtTailUsage = -0.1 }, "PauseAtTailUsage"},
		{"NaN PauseAtTailUsage", func(c *safeack.SubscriberConfig) { c.PauseAtTailUsage = math.NaN() }, "PauseAtTailUsage"},
		{"DrainTimeout equals Rebalance.Timeout", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Consumer.Group.Rebalance.Timeout = 5 * time.Second })
			c.DrainTimeout = 5 * time.Second
		}, "DrainTimeout"},
		{"DrainTimeout above Rebalance.Timeout", func(c *safeack.SubscriberConfig) {
			c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Consumer.Group.Rebalance.Timeout = 2 * time.Second })
			c.DrainTimeout = 3 * time.Second
		}, "DrainTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.mod(&cfg)
			var saramaBefore sarama.Config
			if cfg.OverwriteSaramaConfig != nil {
				saramaBefore = *cfg.OverwriteSaramaConfig
			}
			sub, err := safeack.NewSubscriber(cfg, nil)
			require.Nil(t, sub)
			require.Error(t, err)
			require.ErrorIs(t, err, safeack.ErrInvalidConfig)
			require.Contains(t, err.Error(), tc.field, "the error does not name the field")
			require.ErrorIs(t, cfg.Validate(), safeack.ErrInvalidConfig, "Validate disagrees with NewSubscriber")
			if cfg.OverwriteSaramaConfig != nil {
				require.Equal(t, fmt.Sprint(saramaBefore), fmt.Sprint(*cfg.OverwriteSaramaConfig), "NewSubscriber changed the caller's Sarama config")
			}
		})
	}

	t.Run("accepted", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			mod  func(*safeack.SubscriberConfig)
		}{
			{"nil logger and nil Sarama config", func(*safeack.SubscriberConfig) {}},
			{"NoSleep", func(c *safeack.SubscriberConfig) {
				c.NackResendSleep = safeack.NoSleep
				c.ReconnectRetrySleep = safeack.NoSleep
			}},
			{"no consumer group accepts a Sarama Version too old for groups", func(c *safeack.SubscriberConfig) {
				c.ConsumerGroup = ""
				c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Version = sarama.V0_10_1_0 })
			}},
			{"no consumer group ignores Rebalance.Timeout", func(c *safeack.SubscriberConfig) {
				c.ConsumerGroup = ""
				c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Consumer.Group.Rebalance.Timeout = time.Second })
			}},
			{"OrderingKey with key ordering", func(c *safeack.SubscriberConfig) {
				c.OrderingKey = func(m *sarama.ConsumerMessage) []byte { return m.Key }
			}},
			{"all orderings", func(c *safeack.SubscriberConfig) { c.Ordering = safeack.OrderByPartition }},
			{"DrainTimeout unset below the default Rebalance.Timeout", func(c *safeack.SubscriberConfig) {
				c.OverwriteSaramaConfig = saramaWith(func(s *sarama.Config) { s.Consumer.Group.Rebalance.Timeout = 3 * time.Second })
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cfg := valid()
				tc.mod(&cfg)
				require.NoError(t, cfg.Validate())
				sub, err := safeack.NewSubscriber(cfg, nil)
				require.NoError(t, err)
				require.NotNil(t, sub)
				require.Empty(t, sub.Stats())
				require.NoError(t, sub.Close())
				require.NoError(t, sub.Close())
			})
		}
	})
}

// TestContextHelpers: the context helpers return the Kafka facts of the
// record behind a message, also on a redelivery, and report false for a
// context that did not come from a Subscriber.
func TestContextHelpers(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 3)
	before := time.Now().Add(-time.Second) // broker and producer clocks are this host's
	recs := []kafkatest.Record{
		{Partition: 2, Key: []byte("key-a"), Value: []byte("v0")},
		{Partition: 1, Key: []byte("key-b"), Value: []byte("v1"), Headers: map[string]string{"h": "x"}},
		{Partition: 2, Key: nil, Value: []byte("v2")},
		{Partition: 0, Key: []byte{0, 1, 2}, Value: []byte("v3")},
	}
	produced := c.Produce(t, topic, recs...)
	after := time.Now().Add(time.Second)
	byValue := make(map[string]kafkatest.Produced)
	for _, p := range produced {
		byValue[string(p.Value)] = p
	}

	sub := newTestSubscriber(t, c, group, nil)
	type seen struct {
		partition int32
		offset    int64
		ts        time.Time
		key       []byte
		topic     string
		ok        [5]bool
	}
	var mu sync.Mutex
	got := make(map[string][]seen)
	nacked := make(map[string]bool)
	handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
		ctx := m.Context()
		var s seen
		s.partition, s.ok[0] = safeack.MessagePartitionFromCtx(ctx)
		s.offset, s.ok[1] = safeack.MessagePartitionOffsetFromCtx(ctx)
		s.ts, s.ok[2] = safeack.MessageTimestampFromCtx(ctx)
		s.key, s.ok[3] = safeack.MessageKeyFromCtx(ctx)
		s.topic, s.ok[4] = safeack.MessageTopicFromCtx(ctx)
		v := string(m.Payload)
		mu.Lock()
		got[v] = append(got[v], s)
		first := !nacked[v]
		nacked[v] = true
		mu.Unlock()
		if first {
			m.Nack() // the redelivery must carry the same facts
			return
		}
		m.Ack()
	})
	kafkatest.WaitFor(t, 20*time.Second, "two deliveries of every record", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range recs {
			if len(got[string(r.Value)]) < 2 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for v, ss := range got {
		p, ok := byValue[v]
		require.True(t, ok, "unexpected payload %q", v)
		for i, s := range ss {
			require.Equal(t, [5]bool{true, true, true, true, true}, s.ok, "%s delivery %d: a helper reported no value", p, i)
			require.Equal(t, p.Partition, s.partition, "%s delivery %d: partition", p, i)
			require.Equal(t, p.Offset, s.offset, "%s delivery %d: offset", p, i)
			require.Equal(t, topic, s.topic, "%s delivery %d: topic", p, i)
			require.True(t, bytes.Equal(p.Key, s.key), "%s delivery %d: key %q, want %q", p, i, s.key, p.Key)
			require.True(t, s.ts.After(before) && s.ts.Before(after), "%s delivery %d: timestamp %v not within the produce call [%v, %v]", p, i, s.ts, before, after)
		}
	}

	for _, ctx := range []context.Context{context.Background(), context.TODO()} {
		_, ok := safeack.MessagePartitionFromCtx(ctx)
		require.False(t, ok)
		_, ok = safeack.MessagePartitionOffsetFromCtx(ctx)
		require.False(t, ok)
		_, ok = safeack.MessageTimestampFromCtx(ctx)
		require.False(t, ok)
		_, ok = safeack.MessageKeyFromCtx(ctx)
		require.False(t, ok)
		_, ok = safeack.MessageTopicFromCtx(ctx)
		require.False(t, ok)
	}
	// watermill-kafka's helpers use their own keys; ours must not answer
	// for a message they never delivered.
	wm := message.NewMessage("x", nil)
	_, ok := safeack.MessagePartitionFromCtx(wm.Context())
	require.False(t, ok)
}

// rejectingUnmarshaler rejects every record whose value is "poison".
type rejectingUnmarshaler struct{ kafka.DefaultMarshaler }

var errPoison = errors.New("poison record")

func (u rejectingUnmarshaler) Unmarshal(m *sarama.ConsumerMessage) (*message.Message, error) {
	if string(m.Value) == "poison" {
		return nil, errPoison
	}
	return u.DefaultMarshaler.Unmarshal(m)
}

// TestUnmarshalErrorPolicy: a record the Unmarshaler rejects stops its
// partition by default (nothing after it is delivered or committed, Stats
// say Stuck) while other partitions flow; OnUnmarshalError returning nil
// lets the partition go on with the record completed; a failing
// OnUnmarshalError is retried every ReconnectRetrySleep until it succeeds.
func TestUnmarshalErrorPolicy(t *testing.T) {
	t.Parallel()
	const (
		perPartition = 20
		poisonAt     = 5
	)
	// setup makes a 2-partition topic whose partition 0 has the poison
	// record at poisonAt.
	setup := func(t *testing.T) (*kafkatest.Cluster, string, string) {
		c := kafkatest.Start(t)
		topic := c.NewTopic(t, 2)
		var recs []kafkatest.Record
		for i := 0; i < perPartition; i++ {
			for p := int32(0); p < 2; p++ {
				v := fmt.Sprintf("p%d-%d", p, i)
				if p == 0 && i == poisonAt {
					v = "poison"
				}
				recs = append(recs, kafkatest.Record{Partition: p, Value: []byte(v)})
			}
		}
		c.Produce(t, topic, recs...)
		return c, topic, c.NewGroup(t)
	}
	poison := po{0, poisonAt}

	t.Run("default-stops-partition", func(t *testing.T) {
		t.Parallel()
		c, topic, group := setup(t)
		acks, watch := watchCommits(t, c, group, topic)
		sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Unmarshaler = rejectingUnmarshaler{}
			cfg.ReconnectRetrySleep = 30 * time.Millisecond
			cfg.Ordering = safeack.Unordered
		})
		handleAll(mustSubscribe(t, sub, topic), acks.ack)

		watch.waitCommitted(t, map[int32]int64{0: poisonAt, 1: perPartition}, 20*time.Second)
		kafkatest.WaitFor(t, 10*time.Second, "partition 0 stuck after several unmarshal retries", func() bool {
			ps, ok := statsOf(sub, topic, 0)
			return ok && ps.Stuck && ps.UnmarshalFailures >= 3
		})
		// Partition 1 keeps flowing while 0 is stuck; new records of
		// partition 0 wait behind the rejected one.
		c.Produce(t, topic,
			kafkatest.Record{Partition: 0, Value: []byte("late-0")},
			kafkatest.Record{Partition: 1, Value: []byte("late-1")},
			kafkatest.Record{Partition: 1, Value: []byte("late-2")})
		watch.waitCommitted(t, map[int32]int64{1: perPartition + 2}, 10*time.Second)
		kafkatest.WaitFor(t, 5*time.Second, "another unmarshal retry", func() bool {
			ps, ok := statsOf(sub, topic, 0)
			return ok && ps.UnmarshalFailures >= 5
		})

		ps, ok := statsOf(sub, topic, 0)
		require.True(t, ok)
		require.True(t, ps.Stuck)
		require.GreaterOrEqual(t, ps.UnmarshalFailures, uint64(3))
		require.Equal(t, int64(poisonAt), ps.SafeOffset)
		require.Equal(t, int64(poisonAt), ps.MarkedOffset)
		ps1, ok := statsOf(sub, topic, 1)
		require.True(t, ok)
		require.False(t, ps1.Stuck)
		require.Zero(t, ps1.UnmarshalFailures)

		for k := range acks.snapshot() {
			if k.p == 0 {
				require.Less(t, k.o, int64(poisonAt), "record %v after the rejected one was delivered", k)
			}
		}
		for o := int64(0); o < poisonAt; o++ {
			require.Equal(t, 1, acks.count(po{0, o}))
		}
		require.Equal(t, int64(poisonAt), watch.committed(t)[0], "committed past the rejected record")
		require.Positive(t, watch.check(t))
	})

	t.Run("stuck-partition-revoked-cooperatively", func(t *testing.T) {
		// A partition stuck on a rejected record waits "until it succeeds
		// or the partition is revoked": a cooperative revocation must end
		// it promptly, not after Sarama's Rebalance.Timeout (10 s here),
		// which tears down the member's whole session.
		t.Parallel()
		c, topic, group := kafkatest.StartTopic(t, 2)
		var recs []kafkatest.Record
		for i := 0; i < perPartition; i++ {
			for p := int32(0); p < 2; p++ {
				v := fmt.Sprintf("p%d-%d", p, i)
				if i == poisonAt {
					v = "poison" // both partitions get stuck
				}
				recs = append(recs, kafkatest.Record{Partition: p, Value: []byte(v)})
			}
		}
		c.Produce(t, topic, recs...)
		acks, watch := watchCommits(t, c, group, topic)
		member := func(id string) *safeack.Subscriber {
			return newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
				cfg.Unmarshaler = rejectingUnmarshaler{}
				cfg.ReconnectRetrySleep = 30 * time.Millisecond
				cfg.Ordering = safeack.Unordered
				cfg.DrainTimeout = 500 * time.Millisecond
				cfg.OverwriteSaramaConfig.ClientID = id
				cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
					sarama.NewBalanceStrategyCooperativeSticky(),
				}
			})
		}
		a := member("member-a")
		handleAll(mustSubscribe(t, a, topic), acks.ack)
		watch.waitCommitted(t, map[int32]int64{0: poisonAt, 1: poisonAt}, 20*time.Second)
		kafkatest.WaitFor(t, 10*time.Second, "both partitions stuck", func() bool {
			own := ownedPartitions(a, topic)
			return len(own) == 2 && own[0].Stuck && own[1].Stuck
		})
		before := ownedPartitions(a, topic)

		joined := time.Now()
		b := member("member-b")
		handleAll(mustSubscribe(t, b, topic), acks.ack)
		kafkatest.WaitFor(t, 20*time.Second, "B to get a partition", func() bool {
			ao, bo := ownedPartitions(a, topic), ownedPartitions(b, topic)
			return len(bo) == 1 && len(ao) == 1
		})
		took := time.Since(joined)
		t.Logf("rebalance took %v", took.Round(time.Millisecond))
		// The property is that A's session survives (checked below: a
		// revocation noticed only at Rebalance.Timeout tears it down);
		// the time is a second witness, bounded by that timeout rather
		// than a guess at how fast a loaded broker rebalances.
		if rt := c.SaramaConfig().Consumer.Group.Rebalance.Timeout; took >= rt {
			t.Errorf("the rebalance took %v, Rebalance.Timeout is %v: A's stuck partition did not notice its revocation", took, rt)
		}
		for p, ps := range ownedPartitions(a, topic) {
			if !ps.AssignedAt.Equal(before[p].AssignedAt) {
				t.Errorf("partition %d kept by A was reassigned: A's session was torn down", p)
			}
		}
		// Nothing passed the rejected records meanwhile.
		require.Equal(t, map[int32]int64{0: poisonAt, 1: poisonAt}, watch.committed(t))
		require.Positive(t, watch.check(t))
	})

	t.Run("dead-letter-completes", func(t *testing.T) {
		t.Parallel()
		c, topic, group := setup(t)
		acks, watch := watchCommits(t, c, group, topic)
		var mu sync.Mutex
		var dlq []po
		var dlqErr error
		sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Unmarshaler = rejectingUnmarshaler{}
			cfg.ReconnectRetrySleep = 30 * time.Millisecond
			cfg.Ordering = safeack.Unordered
			cfg.OnUnmarshalError = func(ctx context.Context, m *sarama.ConsumerMessage, err error) error {
				k := po{m.Partition, m.Offset}
				// "Published to a dead-letter topic": the record counts as
				// completed. Its completion is logged like an ack.
				acks.addAt(k, time.Now())
				mu.Lock()
				dlq = append(dlq, k)
				dlqErr = err
				mu.Unlock()
				return nil
			}
		})
		handleAll(mustSubscribe(t, sub, topic), acks.ack)
		watch.waitCommitted(t, map[int32]int64{0: perPartition, 1: perPartition}, 20*time.Second)
		acks.waitAllAcked(t, c, topic, 10*time.Second)
		mu.Lock()
		require.Equal(t, []po{poison}, dlq, "OnUnmarshalError calls")
		require.ErrorIs(t, dlqErr, errPoison)
		mu.Unlock()
		ps, ok := statsOf(sub, topic, 0)
		require.True(t, ok)
		require.False(t, ps.Stuck)
		require.Equal(t, int64(perPartition), ps.SafeOffset)
		require.Positive(t, watch.check(t))
	})

	t.Run("handler-retried", func(t *testing.T) {
		t.Parallel()
		const retrySleep = 100 * time.Millisecond
		c, topic, group := setup(t)
		acks, watch := watchCommits(t, c, group, topic)
		var mu sync.Mutex
		var calls []time.Time
		sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
			cfg.Unmarshaler = rejectingUnmarshaler{}
			cfg.ReconnectRetrySleep = retrySleep
			cfg.Ordering = safeack.Unordered
			cfg.OnUnmarshalError = func(ctx context.Context, m *sarama.ConsumerMessage, err error) error {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, time.Now())
				if len(calls) <= 2 {
					return fmt.Errorf("dead-letter topic unavailable (attempt %d)", len(calls))
				}
				acks.addAt(po{m.Partition, m.Offset}, time.Now())
				return nil
			}
		})
		handleAll(mustSubscribe(t, sub, topic), acks.ack)
		watch.waitCommitted(t, map[int32]int64{0: perPartition, 1: perPartition}, 20*time.Second)
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, calls, 3, "OnUnmarshalError calls")
		for i := 1; i < len(calls); i++ {
			gap := calls[i].Sub(calls[i-1])
			require.GreaterOrEqual(t, gap, retrySleep, "retry %d came after %v, before ReconnectRetrySleep", i, gap)
			require.Less(t, gap, retrySleep+2*time.Second, "retry %d came only after %v", i, gap)
		}
		require.Positive(t, watch.check(t))
	})
}
