package safeack_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// requireBrokerDeadLetters skips the test unless the cluster gives share
// groups a dead-letter topic of their own (KIP-1191: Kafka 4.4 with the
// share.version feature at 2). The embedded broker has none.
func requireBrokerDeadLetters(t *testing.T, c *kafkatest.Cluster) {
	t.Helper()
	if c.Embedded() {
		t.Skip("the embedded broker (kfake) has no share group dead-letter topic (KIP-1191): run against Kafka 4.4+ (SAFEACK_KAFKA_BROKERS)")
	}
	cl, err := kgo.NewClient(append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...))...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	require.NoError(t, err)
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "share.version" && f.MaxVersionLevel >= 2 {
			return
		}
	}
	t.Skip("the cluster's share.version feature is below 2: no share group dead-letter topics (KIP-1191, Kafka 4.4)")
}

// dlqTopic makes a dead-letter topic for group (the broker's
// errors.deadletterqueue.topic.name.prefix is "dlq." by default, and it
// creates none by itself; the topic must allow share groups to write to
// it: errors.deadletterqueue.group.enable, enabled) and names it in the
// group's config, with the original records copied.
func dlqTopic(t *testing.T, c *kafkatest.Cluster, group, topic string, enabled bool) string {
	t.Helper()
	dlq := "dlq." + topic
	enable := strconv.FormatBool(enabled)
	require.NoError(t, c.Admin(t).CreateTopic(dlq, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: -1,
		ConfigEntries: map[string]*string{"errors.deadletterqueue.group.enable": &enable}}, false))
	setShareGroupConfigs(t, c, group, map[string]string{
		"errors.deadletterqueue.topic.name":         dlq,
		"errors.deadletterqueue.copy.record.enable": "true",
	})
	return dlq
}

// readAll reads topic from its start until it holds n records or wait
// passes, and returns what it read.
func readAll(t *testing.T, c *kafkatest.Cluster, topic string, n int, wait time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("reading %s: %v", topic, err)
			}
		})
		recs = append(recs, fs.Records()...)
	}
	return recs
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestShareBrokerDeadLetterQueue (issue 42, KIP-1191): with a group that
// names a dead-letter topic at the broker, a record nacked at
// MaxDeliveries is REJECTed, and the broker writes it to that topic with
// its context, by default even when DeadLetter is set (DeadLetter is not
// called); each such record lands in the topic once and is never also
// accepted. ShareDeadLetterClient keeps safeack's own path: DeadLetter,
// then ACCEPT, nothing in the broker's topic.
func TestShareBrokerDeadLetterQueue(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	requireBrokerDeadLetters(t, c)

	t.Run("auto", func(t *testing.T) {
		t.Parallel()
		topic, group := c.NewTopic(t, 1), c.NewGroup(t)
		dlq := dlqTopic(t, c, group, topic, true)
		const n = 5
		produced := c.ProduceN(t, topic, 1, n, nil)
		var called atomic.Int32
		sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
			cfg.MaxDeliveries = 2
			cfg.DeadLetter = func(context.Context, *message.Message) error {
				called.Add(1)
				return nil
			}
		})
		seen := answerAll(subscribeShare(t, sub, topic), (*message.Message).Nack)
		kafkatest.WaitFor(t, 60*time.Second, "every record rejected", func() bool {
			tot, _ := shareTotals(sub)
			return tot.Rejected == n
		})
		recs := readAll(t, c, dlq, n, 30*time.Second)
		require.Len(t, recs, n, "records in the broker's dead-letter topic")
		byOffset := map[string]*kgo.Record{}
		for _, r := range recs {
			assert.Equal(t, topic, header(r, "__dlq.errors.topic"), "the record's topic in its context")
			assert.Equal(t, group, header(r, "__dlq.errors.group"), "the record's group in its context")
			byOffset[header(r, "__dlq.errors.offset")] = r
		}
		for _, p := range produced {
			r := byOffset[strconv.FormatInt(p.Offset, 10)]
			if assert.NotNil(t, r, "record at offset %d not in the dead-letter topic", p.Offset) {
				assert.Equal(t, string(p.Value), string(r.Value), "the copied record's value")
			}
			assert.Equal(t, []int32{1, 2}, seen.deliveryCounts(string(p.Value)), "deliveries of %s", p.Value)
		}
		tot, _ := shareTotals(sub)
		assert.Zero(t, called.Load(), "DeadLetter called: the broker's dead-letter topic was bypassed")
		assert.Zero(t, tot.Accepted, "records accepted as well as rejected")
		assert.Zero(t, tot.DeadLettered)
	})

	// ShareDeadLetterClient; and a group topic that does not allow share
	// groups to write (the broker would archive the rejected records
	// unwritten): auto keeps DeadLetter then.
	for _, tc := range []struct {
		name    string
		target  safeack.ShareDeadLetterTarget
		enabled bool
	}{{"client", safeack.ShareDeadLetterClient, true}, {"auto, topic not enabled", safeack.ShareDeadLetterAuto, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clientDeadLetter(t, c, tc.target, tc.enabled)
		})
	}
}

// clientDeadLetter: records nacked at MaxDeliveries go to DeadLetter, then
// are accepted; the group's dead-letter topic at the broker gets nothing.
func clientDeadLetter(t *testing.T, c *kafkatest.Cluster, target safeack.ShareDeadLetterTarget, enabled bool) {
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	dlq := dlqTopic(t, c, group, topic, enabled)
	const n = 3
	c.ProduceN(t, topic, 1, n, nil)
	var called atomic.Int32
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.MaxDeliveries = 2
		cfg.DeadLetterTarget = target
		cfg.DeadLetter = func(context.Context, *message.Message) error {
			called.Add(1)
			return nil
		}
	})
	answerAll(subscribeShare(t, sub, topic), (*message.Message).Nack)
	kafkatest.WaitFor(t, 60*time.Second, "every record dead-lettered and accepted", func() bool {
		tot, _ := shareTotals(sub)
		return tot.DeadLettered == n && tot.Accepted == n
	})
	assert.Equal(t, int32(n), called.Load(), "DeadLetter calls")
	tot, _ := shareTotals(sub)
	assert.Zero(t, tot.Rejected, "records rejected")
	// A rejection would be in the topic within seconds; none was sent.
	assert.Empty(t, readAll(t, c, dlq, 1, 3*time.Second), "records in the broker's dead-letter topic")
}

// TestShareDeadLetterTargetBrokerNeedsGroupTopic: ShareDeadLetterBroker on
// a group that names no dead-letter topic fails Subscribe with
// ErrInvalidConfig rather than reject records into no topic; with
// DeadLetter set it is refused at NewShareSubscriber.
func TestShareDeadLetterTargetBrokerNeedsGroupTopic(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic, group := c.NewTopic(t, 1), c.NewGroup(t)
	sub := newShareSub(t, c, group, func(cfg *safeack.ShareSubscriberConfig) {
		cfg.DeadLetterTarget = safeack.ShareDeadLetterBroker
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := sub.Subscribe(ctx, topic)
	require.ErrorIs(t, err, safeack.ErrInvalidConfig)
	require.ErrorContains(t, err, "errors.deadletterqueue.topic.name")

	cfg := safeack.ShareSubscriberConfig{Brokers: c.Brokers(), ShareGroup: group, DeadLetterTarget: safeack.ShareDeadLetterBroker,
		DeadLetter: func(context.Context, *message.Message) error { return nil }}
	require.ErrorIs(t, cfg.Validate(), safeack.ErrInvalidConfig)
	cfg.DeadLetterTarget, cfg.DeadLetter = safeack.ShareDeadLetterClient, nil
	require.ErrorIs(t, cfg.Validate(), safeack.ErrInvalidConfig)
	cfg.DeadLetterTarget = safeack.ShareDeadLetterTarget(7)
	require.ErrorIs(t, cfg.Validate(), safeack.ErrInvalidConfig)
}
