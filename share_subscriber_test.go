package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestShareAckNackReject: an acked record is accepted and not delivered
// again; a nacked one is released and comes back with its delivery count one
// higher; one nacked at every delivery is rejected at MaxDeliveries and
// never delivered again, to this member or to a new one.
func TestShareAckNackReject(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) { cfg.MaxDeliveries = 3 })
	msgs := subscribeShare(t, sub, topic)
	c.Produce(t, topic,
		kafkatest.Record{Value: []byte("ok")},
		kafkatest.Record{Value: []byte("flaky")},
		kafkatest.Record{Value: []byte("poison")},
	)

	seen := newShareSeen()
	go func() {
		for msg := range msgs {
			seen.add(msg)
			switch v := string(msg.Payload); {
			case v == "flaky" && seen.count(v) < 2, v == "poison":
				msg.Nack()
			default:
				msg.Ack()
			}
		}
	}()
	kafkatest.WaitFor(t, 20*time.Second, "poison delivered 3 times, flaky twice", func() bool {
		return seen.count("poison") == 3 && seen.count("flaky") == 2
	})
	assert.Equal(t, []int32{1, 2, 3}, seen.deliveryCounts("poison"))
	assert.Equal(t, []int32{1, 2}, seen.deliveryCounts("flaky"))
	kafkatest.WaitFor(t, 10*time.Second, "the counters", func() bool {
		tot, inFlight := shareTotals(sub)
		return tot.Rejected == 1 && tot.Accepted == 2 && tot.Released == 3 && inFlight == 0
	})

	// A sentinel after them arrives; nothing before it comes back, here or
	// at a new member of the group.
	require.NoError(t, sub.Close())
	second := newShareSub(t, c, group, nil)
	msgs2 := subscribeShare(t, second, topic)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("sentinel")})
	seen2 := newShareSeen()
	go func() {
		for msg := range msgs2 {
			seen2.add(msg)
			msg.Ack()
		}
	}()
	kafkatest.WaitFor(t, 20*time.Second, "the sentinel", func() bool { return seen2.count("sentinel") == 1 })
	time.Sleep(300 * time.Millisecond) // let a wrongly redelivered record show up (its fetch is the sentinel's or earlier)
	assert.Equal(t, 1, seen2.total(), "records before the sentinel came back: %v", seen2.counts)
	assert.Equal(t, 3, seen.count("poison"), "the rejected record was delivered again")
}

// TestShareCloseFlushesAndReleases: a subscription of ten members, each
// holding one record (a member hands out one poll's records at a time, and a
// poll may return fewer than are there), acks five just before Close and
// never answers the others. Close sends the five acks
// and releases the five others: a second member gets exactly those five at
// once (their delivery count two or more), long before the acquisition lock
// (30 s) would have freed them.
func TestShareCloseFlushesAndReleases(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 30*time.Second)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	first := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.Members, cfg.MaxInFlight, cfg.MaxPollRecords = 10, 10, 1
		// Only Close sends the acks: nothing flushes them earlier.
		cfg.AckFlushInterval = time.Hour
		cfg.DrainTimeout = 200 * time.Millisecond
	})
	msgs := subscribeShare(t, first, topic)
	c.ProduceN(t, topic, 1, 10, nil)

	var held []*message.Message
	for len(held) < 10 {
		select {
		case m := <-msgs:
			held = append(held, m)
		case <-time.After(20 * time.Second):
			// Shorter than the acquisition lock (30 s): a record left
			// waiting in a member's client buffer, its lock not renewed,
			// would come back only after it (see
			// TestShareRecordFetchedBetweenPollsKeepsItsLock).
			tot, inFlight := shareTotals(first)
			t.Fatalf("got %d of 10 records; in flight %d, %+v", len(held), inFlight, tot)
		}
	}
	acked := map[string]bool{}
	for _, m := range held[:5] {
		m.Ack()
		acked[string(m.Payload)] = true
	}
	kafkatest.WaitFor(t, 5*time.Second, "the acks counted", func() bool {
		tot, _ := shareTotals(first)
		return tot.Accepted == 5
	})

	second := newShareSub(t, c, group, nil)
	msgs2 := subscribeShare(t, second, topic)
	start := time.Now()
	require.NoError(t, first.Close())
	for _, m := range held[5:] {
		select {
		case <-m.Context().Done():
		default:
			t.Fatalf("message %s: context alive after Close", m.Payload)
		}
	}
	tot, inFlight := shareTotals(first)
	assert.Equal(t, uint64(5), tot.ReleasedAtClose)
	assert.Zero(t, inFlight)

	seen2 := newShareSeen()
	go func() {
		for m := range msgs2 {
			seen2.add(m)
			m.Ack()
		}
	}()
	kafkatest.WaitFor(t, 10*time.Second, "the five released records at the second member", func() bool { return seen2.distinct() == 5 })
	took := time.Since(start)
	assert.Less(t, took, 15*time.Second, "released records came back only after the acquisition lock")
	time.Sleep(500 * time.Millisecond)
	for _, m := range held[5:] {
		v := string(m.Payload)
		assert.Equal(t, 1, seen2.count(v), "released record %s", v)
		// Two at least: the first member's delivery, released at Close.
		// Another member of the closing subscription may acquire a
		// released record before it leaves and release it again (its
		// fetch long-polls at the broker), which counts one more.
		dcs := seen2.deliveryCounts(v)
		if assert.Len(t, dcs, 1, "deliveries of %s", v) {
			assert.GreaterOrEqual(t, dcs[0], int32(2), "delivery count of %s", v)
		}
	}
	for v := range acked {
		assert.Zero(t, seen2.count(v), "acked record %s delivered again: its ack was lost at Close", v)
	}
	t.Logf("released records at the second member %v after Close started", took)
}

// TestShareTwoMembersOnePartition: two members of one share group on a
// single partition both get records, and together handle every record.
// Each handler holds its record until both members got one: a member
// holds at most Members x MaxPollRecords records, so the one assigned
// first cannot take them all before the other is assigned (a heartbeat
// later), however fast it handles them.
func TestShareTwoMembersOnePartition(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	group := c.NewGroup(t)
	const n = 300
	seen := newShareSeen()
	var per [2]atomic.Int64
	both := make(chan struct{})
	var bothOnce sync.Once
	for i := range 2 {
		sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) { cfg.MaxInFlight = 8 })
		msgs := subscribeShare(t, sub, topic)
		go func() {
			for m := range msgs {
				go func() {
					seen.add(m)
					per[i].Add(1)
					if per[0].Load() > 0 && per[1].Load() > 0 {
						bothOnce.Do(func() { close(both) })
					}
					select {
					case <-both:
					case <-time.After(30 * time.Second):
					}
					time.Sleep(2 * time.Millisecond)
					m.Ack()
				}()
			}
		}()
	}
	c.ProduceN(t, topic, 1, n, nil)
	kafkatest.WaitFor(t, 60*time.Second, "every record handled", func() bool { return seen.distinct() == n })
	t.Logf("member 0: %d, member 1: %d, deliveries %d", per[0].Load(), per[1].Load(), seen.total())
	assert.Positive(t, per[0].Load(), "member 0 got no work")
	assert.Positive(t, per[1].Load(), "member 1 got no work")
}

// TestShareContextHelpers: a share message's context gives its record's
// topic, partition, offset, key, timestamp and delivery count.
func TestShareContextHelpers(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 2)
	sub := newShareSub(t, c, c.NewGroup(t), nil)
	msgs := subscribeShare(t, sub, topic)
	before := time.Now().Add(-time.Second)
	p := c.Produce(t, topic, kafkatest.Record{Partition: 1, Key: []byte("k1"), Value: []byte("v")})[0]
	m := receive(t, msgs, 20*time.Second, "no message")
	ctx := m.Context()
	part, ok := safeack.MessagePartitionFromCtx(ctx)
	assert.True(t, ok)
	assert.Equal(t, int32(1), part)
	off, _ := safeack.MessagePartitionOffsetFromCtx(ctx)
	assert.Equal(t, p.Offset, off)
	key, _ := safeack.MessageKeyFromCtx(ctx)
	assert.Equal(t, []byte("k1"), key)
	top, _ := safeack.MessageTopicFromCtx(ctx)
	assert.Equal(t, topic, top)
	ts, _ := safeack.MessageTimestampFromCtx(ctx)
	assert.True(t, ts.After(before), "timestamp %v", ts)
	dc, ok := safeack.MessageDeliveryCountFromCtx(ctx)
	assert.True(t, ok)
	assert.Equal(t, int32(1), dc)
	st := sub.Stats()
	require.Len(t, st, 1)
	assert.Equal(t, 1, st[0].InFlight)
	assert.Equal(t, p.Offset, st[0].OldestInFlight)
	m.Ack()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context alive after Ack")
	}
	_, ok = safeack.MessageDeliveryCountFromCtx(context.Background())
	assert.False(t, ok)
}

// TestShareConfigErrors: every invalid field is refused with an error
// naming it, and nothing is made.
func TestShareConfigErrors(t *testing.T) {
	t.Parallel()
	byKey, byPartition, unordered := safeack.OrderByKey, safeack.OrderByPartition, safeack.Unordered
	valid := func() safeack.ShareSubscriberConfig {
		return safeack.ShareSubscriberConfig{Brokers: []string{"localhost:9092"}, ShareGroup: "g"}
	}
	cases := []struct {
		field string
		mod   func(*safeack.ShareSubscriberConfig)
	}{
		{"Brokers", func(c *safeack.ShareSubscriberConfig) { c.Brokers = nil }},
		{"Brokers", func(c *safeack.ShareSubscriberConfig) { c.Brokers = []string{""} }},
		{"ShareGroup", func(c *safeack.ShareSubscriberConfig) { c.ShareGroup = "" }},
		{"Ordering", func(c *safeack.ShareSubscriberConfig) { c.Ordering = &byKey }},
		{"Ordering", func(c *safeack.ShareSubscriberConfig) { c.Ordering = &byPartition }},
		{"MaxInFlight", func(c *safeack.ShareSubscriberConfig) { c.MaxInFlight = -1 }},
		{"MaxPollRecords", func(c *safeack.ShareSubscriberConfig) { c.MaxPollRecords = -1 }},
		{"MaxPollRecords", func(c *safeack.ShareSubscriberConfig) { c.MaxPollRecords = 1 << 17 }},
		{"AcquireMode", func(c *safeack.ShareSubscriberConfig) { c.AcquireMode = 7 }},
		{"Members", func(c *safeack.ShareSubscriberConfig) { c.Members = -1 }},
		{"MaxDeliveries", func(c *safeack.ShareSubscriberConfig) { c.MaxDeliveries = -1 }},
		{"InitialOffset", func(c *safeack.ShareSubscriberConfig) { c.InitialOffset = 5 }},
		{"AckFlushInterval", func(c *safeack.ShareSubscriberConfig) { c.AckFlushInterval = -time.Second }},
		{"DrainTimeout", func(c *safeack.ShareSubscriberConfig) { c.DrainTimeout = -time.Second }},
		{"WaitForTopicCreationTimeout", func(c *safeack.ShareSubscriberConfig) { c.WaitForTopicCreationTimeout = -time.Second }},
		{"ClientOptions", func(c *safeack.ShareSubscriberConfig) { c.ClientOptions = append(c.ClientOptions, nil) }},
	}
	for _, tc := range cases {
		cfg := valid()
		tc.mod(&cfg)
		sub, err := safeack.NewShareSubscriber(cfg, nil)
		require.Error(t, err, tc.field)
		assert.Nil(t, sub)
		assert.ErrorIs(t, err, safeack.ErrInvalidConfig)
		assert.Contains(t, err.Error(), ": "+tc.field+": ", "error %q does not name %s", err, tc.field)
	}
	cfg := valid()
	cfg.Ordering = &unordered
	cfg.InitialOffset = sarama.OffsetNewest
	_, err := safeack.NewShareSubscriber(cfg, nil)
	require.NoError(t, err)
	cfg.Ordering = &byKey
	err = cfg.Validate()
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "share groups keep no order"), err.Error())
}

// TestShareUnreachable: Subscribe fails when no broker answers, and the
// subscriber stays usable for Close.
func TestShareUnreachable(t *testing.T) {
	t.Parallel()
	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
		Brokers:    []string{"127.0.0.1:1"},
		ShareGroup: "g",
	}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = sub.Subscribe(ctx, "t")
	require.Error(t, err)
	assert.ErrorIs(t, sub.Ready(), safeack.ErrNotReady)
	require.NoError(t, sub.Close())
	_, err = sub.Subscribe(context.Background(), "t")
	assert.ErrorIs(t, err, safeack.ErrSubscriberClosed)
}

// TestShareUnmarshalErrorRejected: a record the Unmarshaler refuses is
// rejected (not handed out, counted, never delivered again); with
// OnUnmarshalError returning nil it is accepted.
func TestShareUnmarshalErrorRejected(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	var handled atomic.Int64
	sub := newShareSub(t, c, c.NewGroup(t), func(cfg *safeack.ShareSubscriberConfig) {
		cfg.Unmarshaler = refusingUnmarshaler{}
	})
	msgs := subscribeShare(t, sub, topic)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("bad")}, kafkatest.Record{Value: []byte("good")})
	m := <-msgs
	assert.Equal(t, "good", string(m.Payload))
	m.Ack()
	kafkatest.WaitFor(t, 5*time.Second, "the counters", func() bool {
		tot, _ := shareTotals(sub)
		return tot.Rejected == 1 && tot.Accepted == 1
	})
	st := sub.Stats()
	require.Len(t, st, 1)
	assert.Equal(t, uint64(1), st[0].UnmarshalFailures)

	topic2 := c.NewTopic(t, 1)
	sub2 := newShareSub(t, c, c.NewGroup(t), func(cfg *safeack.ShareSubscriberConfig) {
		cfg.Unmarshaler = refusingUnmarshaler{}
		cfg.OnUnmarshalError = func(_ context.Context, msg *sarama.ConsumerMessage, err error) error {
			handled.Add(1)
			return nil
		}
	})
	subscribeShare(t, sub2, topic2)
	c.Produce(t, topic2, kafkatest.Record{Value: []byte("bad")})
	kafkatest.WaitFor(t, 10*time.Second, "accepted after OnUnmarshalError", func() bool {
		tot, _ := shareTotals(sub2)
		return tot.Accepted == 1 && handled.Load() == 1
	})
}

type refusingUnmarshaler struct{}

func (refusingUnmarshaler) Unmarshal(m *sarama.ConsumerMessage) (*message.Message, error) {
	if string(m.Value) == "bad" {
		return nil, errors.New("refused")
	}
	return message.NewMessage(fmt.Sprint(m.Offset), m.Value), nil
}

// TestShareLockRenewed: a handler that takes three times the acquisition
// lock (2 s here) keeps its record: its lock is renewed, no other member
// gets the record meanwhile, and its Ack is accepted.
func TestShareLockRenewed(t *testing.T) {
	t.Parallel()
	// 2 s: a renewal sent at half the lock must be answered within the
	// other half, and a broker loaded by CI's parallel runs took longer
	// than 500 ms once (a 1 s lock: the ack was counted late).
	const lock = 2 * time.Second
	c, topic, group := shareTopicWithLock(t, lock)
	slow := newShareSub(t, c, group, nil)
	msgs := subscribeShare(t, slow, topic)
	c.Produce(t, topic, kafkatest.Record{Value: []byte("slow")})
	m := receive(t, msgs, 20*time.Second, "no message")
	// Another member joins while the record is being handled.
	other := newShareSub(t, c, group, nil)
	others := subscribeShare(t, other, topic)
	seen := answerAll(others, (*message.Message).Ack)
	time.Sleep(3 * lock) // the handler's work: three lock durations
	m.Ack()
	kafkatest.WaitFor(t, 10*time.Second, "the slow record accepted", func() bool {
		tot, _ := shareTotals(slow)
		return tot.Accepted == 1
	})
	time.Sleep(lock * 3 / 2) // a lock expiring after the ack would show now
	tot, _ := shareTotals(slow)
	assert.Zero(t, tot.AckErrors, "the broker refused the ack: the lock had expired")
	assert.GreaterOrEqual(t, tot.LockRenewals, uint64(2))
	assert.Zero(t, seen.count("slow"), "the other member got the record while it was being handled")
}

// TestShareUnsupportedBroker: on a broker that does not serve share groups
// (Kafka 3.9's requests), Subscribe fails with ErrShareGroupsUnsupported,
// naming the missing request, and nothing is left running.
func TestShareUnsupportedBroker(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.WithKfakeOpts(kfake.MaxVersions(kversion.V3_9_0())))
	c.RequireEmbedded(t)
	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{Brokers: c.Brokers(), ShareGroup: "g"}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, c.NewTopic(t, 1))
	require.ErrorIs(t, err, safeack.ErrShareGroupsUnsupported)
	assert.Nil(t, msgs)
	assert.Contains(t, err.Error(), "ShareGroupHeartbeat")
	assert.ErrorIs(t, sub.Ready(), safeack.ErrNotReady)
	require.NoError(t, sub.Close())
}

// TestShareGroupsNotEnabled: a cluster that serves the share group requests
// but has not enabled share groups (share.version 0, as Kafka 4.0 and 4.1
// ship them as an early-access preview) is refused at Subscribe with
// ErrShareGroupsUnsupported naming the feature, not joined to hand nothing
// out; CheckShareGroups says the same, and nil once the feature is on.
func TestShareGroupsNotEnabled(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	c.RequireEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, safeack.CheckShareGroups(ctx, c.Brokers()))
	setShareVersion := func(level int16) {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
		require.NoError(t, err)
		defer cl.Close()
		req := kmsg.NewPtrUpdateFeaturesRequest()
		fu := kmsg.NewUpdateFeaturesRequestFeatureUpdate()
		fu.Feature, fu.MaxVersionLevel, fu.UpgradeType = "share.version", level, 2 // safe downgrade
		req.FeatureUpdates = append(req.FeatureUpdates, fu)
		resp, err := req.RequestWith(ctx, cl)
		require.NoError(t, err)
		require.NoError(t, kerr.ErrorForCode(resp.ErrorCode), "UpdateFeatures")
		for _, r := range resp.Results {
			require.NoError(t, kerr.ErrorForCode(r.ErrorCode), "UpdateFeatures %s", r.Feature)
		}
	}
	setShareVersion(0)
	err := safeack.CheckShareGroups(ctx, c.Brokers())
	require.ErrorIs(t, err, safeack.ErrShareGroupsUnsupported)
	assert.Contains(t, err.Error(), "share.version")

	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{Brokers: c.Brokers(), ShareGroup: "g"}, nil)
	require.NoError(t, err)
	msgs, err := sub.Subscribe(ctx, c.NewTopic(t, 1))
	require.ErrorIs(t, err, safeack.ErrShareGroupsUnsupported)
	assert.Nil(t, msgs)
	require.NoError(t, sub.Close())
}
