package safeack_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// startShareCluster starts a broker for share group tests. On the embedded
// broker, expired acquisition locks are swept every 100 ms, so a test that
// waits for a lock timeout waits for the lock duration only; lockDuration
// zero keeps the broker's default (30 s). A real cluster keeps its own
// settings (share tests there are run on Kafka 4.2+, see
// requireShareGroups).
func startShareCluster(t testing.TB, lockDuration time.Duration, opts ...kfake.Opt) *kafkatest.Cluster {
	t.Helper()
	cfg := map[string]string{"share.record.lock.sweep.interval.ms": "100"}
	if lockDuration > 0 {
		cfg["group.share.record.lock.duration.ms"] = itoa(lockDuration.Milliseconds())
	}
	opts = append([]kfake.Opt{kfake.BrokerConfigs(cfg)}, opts...)
	c := kafkatest.Start(t, kafkatest.WithKfakeOpts(opts...))
	requireShareGroups(t, c)
	return c
}

// requireShareGroups skips the test when the cluster does not serve share
// groups (a real cluster before Kafka 4.2, or without share groups
// enabled): its brokers do not list the share group requests.
func requireShareGroups(t testing.TB, c *kafkatest.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := safeack.CheckShareGroups(ctx, c.Brokers(), c.KgoOpts()...); errors.Is(err, safeack.ErrShareGroupsUnsupported) {
		t.Skipf("%v: needs Kafka 4.2+ with share groups enabled", err)
	} else {
		require.NoError(t, err, "ApiVersions")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// setShareGroupConfigs sets group configs (IncrementalAlterConfigs on the
// group) on a real cluster, where the broker's defaults are long for tests
// (a 5 s heartbeat interval, which paces assignments, and a 30 s
// acquisition lock); the embedded broker is configured at start.
func setShareGroupConfigs(t *testing.T, c *kafkatest.Cluster, group string, configs map[string]string) {
	t.Helper()
	if c.Embedded() {
		return
	}
	cl, err := kgo.NewClient(append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...))...)
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	for name, value := range configs {
		cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		cfg.Name, cfg.Value = name, &value
		res.Configs = append(res.Configs, cfg)
	}
	req.Resources = append(req.Resources, res)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	for _, r := range resp.Resources {
		require.NoError(t, kerr.ErrorForCode(r.ErrorCode), "group configs %v", configs)
	}
}

// newShareSub makes a ShareSubscriber on c for group, starting at the log
// start, with short timings, connecting as the harness does (TLS and SASL
// on a secured cluster: ClientOptions); mod changes the config first. It
// is closed at cleanup.
func newShareSub(t *testing.T, c *kafkatest.Cluster, group string, mod func(*safeack.ShareSubscriberConfig)) *safeack.ShareSubscriber {
	t.Helper()
	return newShareSubLogged(t, c, group, keptLogger(t), mod)
}

// newShareSubLogged is newShareSub logging to logger.
func newShareSubLogged(t *testing.T, c *kafkatest.Cluster, group string, logger watermill.LoggerAdapter, mod func(*safeack.ShareSubscriberConfig)) *safeack.ShareSubscriber {
	t.Helper()
	setShareGroupConfigs(t, c, group, map[string]string{"share.heartbeat.interval.ms": "500"})
	cfg := safeack.ShareSubscriberConfig{
		Brokers:       c.Brokers(),
		ShareGroup:    group,
		InitialOffset: sarama.OffsetOldest,
		DrainTimeout:  500 * time.Millisecond,
		MaxInFlight:   16,
		ClientOptions: c.KgoOpts(),
	}
	if mod != nil {
		mod(&cfg)
	}
	sub, err := safeack.NewShareSubscriber(cfg, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// subscribeShare subscribes sub to topic, skipping the test when the
// cluster does not serve share groups, and waits until the member joined.
func subscribeShare(t *testing.T, sub *safeack.ShareSubscriber, topic string) <-chan *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	if errors.Is(err, safeack.ErrShareGroupsUnsupported) {
		t.Skipf("share groups not served by this cluster: %v", err)
	}
	require.NoError(t, err)
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	require.NoError(t, sub.WaitReady(wctx))
	return msgs
}

// shareSeen records what a consumer got, by value.
type shareSeen struct {
	mu     sync.Mutex
	counts map[string]int
	dcs    map[string][]int32 // delivery counts, in arrival order
}

// answerAll answers every message of msgs with answer (Ack or Nack), one
// at a time, recording each in the returned shareSeen.
func answerAll(msgs <-chan *message.Message, answer func(*message.Message) bool) *shareSeen {
	seen := newShareSeen()
	go func() {
		for m := range msgs {
			seen.add(m)
			answer(m)
		}
	}()
	return seen
}

func newShareSeen() *shareSeen {
	return &shareSeen{counts: make(map[string]int), dcs: make(map[string][]int32)}
}

func (s *shareSeen) add(msg *message.Message) {
	dc, _ := safeack.MessageDeliveryCountFromCtx(msg.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	v := string(msg.Payload)
	s.counts[v]++
	s.dcs[v] = append(s.dcs[v], dc)
}

func (s *shareSeen) count(v string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[v]
}

func (s *shareSeen) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.counts)
}

func (s *shareSeen) deliveryCounts(v string) []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int32(nil), s.dcs[v]...)
}

func (s *shareSeen) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.counts {
		n += c
	}
	return n
}

// shareTotals sums a ShareSubscriber's counters over its partitions.
func shareTotals(sub *safeack.ShareSubscriber) (total safeack.ShareCounters, inFlight int) {
	for _, st := range sub.Stats() {
		total.Received += st.Received
		total.Redelivered += st.Redelivered
		total.Accepted += st.Accepted
		total.Released += st.Released
		total.Rejected += st.Rejected
		total.DeadLettered += st.DeadLettered
		total.ReleasedAtClose += st.ReleasedAtClose
		total.Deferred += st.Deferred
		total.AckErrors += st.AckErrors
		total.LockRenewals += st.LockRenewals
		total.GivenBack += st.GivenBack
		total.MaxDeliveryCount = max(total.MaxDeliveryCount, st.MaxDeliveryCount)
		inFlight += st.InFlight
	}
	return total, inFlight
}

// shareTopicWithLock starts a share cluster on which records stay
// acquired for lock (the embedded broker's config; a group config on a
// real one) and makes a one-partition topic and a group.
func shareTopicWithLock(t *testing.T, lock time.Duration) (c *kafkatest.Cluster, topic, group string) {
	t.Helper()
	c = startShareCluster(t, lock)
	topic, group = c.NewTopic(t, 1), c.NewGroup(t)
	setShareGroupConfigs(t, c, group, map[string]string{"share.record.lock.duration.ms": itoa(lock.Milliseconds())})
	return c, topic, group
}

// concurrency counts the messages a test's handlers hold unanswered at
// once, and the most there were.
type concurrency struct{ open, most atomic.Int32 }

func (c *concurrency) begin() {
	now := c.open.Add(1)
	for prev := c.most.Load(); now > prev && !c.most.CompareAndSwap(prev, now); prev = c.most.Load() {
	}
}

func (c *concurrency) end() { c.open.Add(-1) }
