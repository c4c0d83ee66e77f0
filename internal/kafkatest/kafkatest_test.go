package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// markHandler marks every message with metadata "m<offset>" and counts what
// it saw; commits happen when the test calls Commit on the live session.
type markHandler struct {
	mu   sync.Mutex
	seen map[TopicPartition][]int64
	sess sarama.ConsumerGroupSession
}

func (h *markHandler) Setup(s sarama.ConsumerGroupSession) error {
	h.mu.Lock()
	h.sess = s
	h.mu.Unlock()
	return nil
}

func (h *markHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *markHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for {
		select {
		case <-s.Context().Done():
			return nil
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			// Marked before it counts as seen: a test that waits until
			// every record is seen and then commits must find them marked.
			s.MarkMessage(m, fmt.Sprintf("m%d", m.Offset))
			h.mu.Lock()
			tp := TopicPartition{m.Topic, m.Partition}
			h.seen[tp] = append(h.seen[tp], m.Offset)
			h.mu.Unlock()
		}
	}
}

func (h *markHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, offs := range h.seen {
		n += len(offs)
	}
	return n
}

func (h *markHandler) commit() {
	h.mu.Lock()
	s := h.sess
	h.mu.Unlock()
	s.Commit()
}

// TestRoundTrip produces to a 3-partition topic, consumes everything with a
// plain Sarama consumer group, commits once, and checks the commit both as
// the broker saw it (ObserveCommits) and as the broker stored it
// (CommittedOffsets).
func TestRoundTrip(t *testing.T) {
	c := Start(t)
	var log *CommitLog
	if c.CanObserveCommits() {
		log = c.ObserveCommits(t)
		require.NotNil(t, log)
	} else {
		require.Nil(t, c.ObserveCommits(t))
	}

	const partitions, n = 3, 30
	topic := c.NewTopic(t, partitions)
	produced := c.ProduceN(t, topic, partitions, n, func(i int) string { return fmt.Sprintf("k%d", i%5) })
	require.Len(t, produced, n)
	for i, p := range produced {
		require.Equal(t, int32(i%partitions), p.Partition, "record %d", i)
		require.Equal(t, int64(i/partitions), p.Offset, "record %d", i)
		require.Equal(t, fmt.Sprintf("k%d", i%5), string(p.Key))
	}
	require.Equal(t, produced, c.ProducedRecords(topic))
	want := map[int32]int64{0: n / partitions, 1: n / partitions, 2: n / partitions}
	require.Equal(t, want, c.HighWaterMarks(t, topic))

	group := c.NewGroup(t)
	for p, co := range c.CommittedOffsets(t, group, topic) {
		require.Equal(t, CommittedOffset{Offset: -1}, co, "partition %d before any commit", p)
	}

	cfg := c.SaramaConfig()
	// Only the explicit Commit below may commit, so the log holds exactly
	// what the test asked for.
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cg, err := sarama.NewConsumerGroup(c.Brokers(), group, cfg)
	require.NoError(t, err)
	h := &markHandler{seen: make(map[TopicPartition][]int64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if err := cg.Consume(ctx, []string{topic}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
				done <- err
				return
			}
		}
		done <- nil
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, cg.Close())
	})

	WaitFor(t, 10*time.Second, "all records consumed", func() bool { return h.count() == n })
	before := time.Now()
	h.commit()

	wantCommitted := map[int32]CommittedOffset{}
	for p, off := range want {
		wantCommitted[p] = CommittedOffset{Offset: off, Metadata: fmt.Sprintf("m%d", off-1)}
	}
	if log != nil {
		log.WaitForOffsets(t, 5*time.Second, group, topic, want)
		require.Equal(t, wantCommitted, log.Latest(group, topic))
		commits := log.Commits()
		require.NotEmpty(t, commits)
		last := commits[len(commits)-1]
		require.Equal(t, group, last.Group)
		require.Positive(t, last.Generation)
		require.NotEmpty(t, last.MemberID)
		require.True(t, last.At.After(before), "commit observed after Commit was called")
		co, ok := last.Offset(topic, 1)
		require.True(t, ok)
		require.Equal(t, wantCommitted[1], co)

		// Every commit seen so far stays within what was produced, and
		// nothing was committed before the test asked for it.
		checked := log.CheckUntil(t, time.Now(), func(o ObservedCommit) error {
			if o.At.Before(before) {
				return errors.New("commit before Commit() was called")
			}
			for tp, co := range o.Offsets {
				if tp.Topic != topic || co.Offset < 0 || co.Offset > want[tp.Partition] {
					return fmt.Errorf("%v: offset %d outside [0, %d]", tp, co.Offset, want[tp.Partition])
				}
			}
			return nil
		})
		require.Positive(t, checked)
		require.Empty(t, log.Until(before))
		require.Len(t, log.Since(0), log.Len())
	}
	// The broker stored the same thing the request carried.
	WaitFor(t, 5*time.Second, "committed offsets readable", func() bool {
		return c.CommittedOffsets(t, group, topic)[0].Offset == want[0]
	})
	require.Equal(t, wantCommitted, c.CommittedOffsets(t, group, topic))
}

// TestProduceExplicit checks explicit partitions, null keys and headers, read
// back with a plain partition consumer.
func TestProduceExplicit(t *testing.T) {
	c := Start(t)
	topic := c.NewTopic(t, 3)
	got := c.Produce(t, topic,
		Record{Partition: 2, Value: []byte("a"), Headers: map[string]string{"h1": "v1", "h0": "v0"}},
		Record{Partition: 0, Key: []byte("k"), Value: []byte("b")},
		Record{Partition: 2, Value: []byte("c")},
	)
	require.Equal(t, []int64{0, 0, 1}, []int64{got[0].Offset, got[1].Offset, got[2].Offset})
	require.Equal(t, []int32{2, 0, 2}, []int32{got[0].Partition, got[1].Partition, got[2].Partition})
	require.Equal(t, map[int32]int64{0: 1, 1: 0, 2: 2}, c.HighWaterMarks(t, topic))
	require.Equal(t, topic+"/2@1", got[2].String())

	consumer, err := sarama.NewConsumer(c.Brokers(), c.SaramaConfig())
	require.NoError(t, err)
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 2, sarama.OffsetOldest)
	require.NoError(t, err)
	defer pc.Close()
	var msgs []*sarama.ConsumerMessage
	for len(msgs) < 2 {
		select {
		case m := <-pc.Messages():
			msgs = append(msgs, m)
		case <-time.After(5 * time.Second):
			t.Fatal("timed out reading partition 2")
		}
	}
	require.Nil(t, msgs[0].Key)
	require.Equal(t, "a", string(msgs[0].Value))
	require.Len(t, msgs[0].Headers, 2)
	// Headers go out sorted by key, so the order is stable.
	require.Equal(t, "h0", string(msgs[0].Headers[0].Key))
	require.Equal(t, "v1", string(msgs[0].Headers[1].Value))
	require.Equal(t, "c", string(msgs[1].Value))
}

// TestNames checks that names are unique, legal, and built from the test name.
func TestNames(t *testing.T) {
	c := Start(t)
	t.Run("odd name/with spaces:and*stars", func(t *testing.T) {
		a, b := c.NewTopic(t, 1), c.NewTopic(t, 1)
		require.NotEqual(t, a, b)
		for _, name := range []string{a, b, c.NewGroup(t)} {
			require.Contains(t, name, "TestNames-odd_name-with_spaces-and-stars")
			require.Equal(t, -1, strings.IndexFunc(name, func(r rune) bool {
				return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
			}), name)
		}
		require.NotEqual(t, c.NewGroup(t), c.NewGroup(t))
	})
	long := uniqueName("t-", strings.Repeat("x", 500))
	require.Less(t, len(long), 130)
}

// fakeTB records a Fatalf instead of stopping the goroutine, so WaitFor's
// failure path can be tested.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
}

func TestWaitFor(t *testing.T) {
	calls := 0
	WaitFor(t, time.Second, "third call", func() bool { calls++; return calls == 3 })
	require.Equal(t, 3, calls)

	f := &fakeTB{TB: t}
	start := time.Now()
	WaitFor(f, 50*time.Millisecond, "never", func() bool { return false })
	require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	require.Contains(t, f.failed, "never")
}

// TestRequireEmbedded checks the embedded accessors agree with each other.
func TestRequireEmbedded(t *testing.T) {
	c := Start(t)
	require.Equal(t, c.Embedded(), c.Kfake() != nil)
	require.Equal(t, c.Embedded(), c.CanObserveCommits())
	require.NotEmpty(t, c.Brokers())
	c.RequireEmbedded(t) // skips on a real cluster
	require.Len(t, c.Brokers(), 1)

	c3 := Start(t, WithBrokers(3))
	require.Len(t, c3.Brokers(), 3)
	topic := c3.NewTopic(t, 6)
	c3.ProduceN(t, topic, 6, 12, nil)
	require.Equal(t, map[int32]int64{0: 2, 1: 2, 2: 2, 3: 2, 4: 2, 5: 2}, c3.HighWaterMarks(t, topic))
}

// TestObserveTopicIDCommit sends an OffsetCommit v10, which names topics by
// ID only, and checks the log resolves the ID to the topic name (a lookup
// made from inside kfake's control function).
func TestObserveTopicIDCommit(t *testing.T) {
	c := Start(t)
	c.RequireEmbedded(t)
	log := c.ObserveCommits(t)
	topic := c.NewTopic(t, 2)
	ti := c.Kfake().TopicInfo(topic)
	require.NotNil(t, ti)

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
	require.NoError(t, err)
	defer cl.Close()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version = 10
	req.Group = c.NewGroup(t)
	req.Generation = -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.TopicID = ti.TopicID
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition = 1
	rp.Offset = 0
	meta := "x"
	rp.Metadata = &meta
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = req.RequestWith(ctx, cl)
	require.NoError(t, err)

	commits := log.Commits()
	require.Len(t, commits, 1)
	require.Equal(t, int16(10), commits[0].Version)
	co, ok := commits[0].Offset(topic, 1)
	require.True(t, ok, "offsets: %v", commits[0].Offsets)
	require.Equal(t, CommittedOffset{Offset: 0, Metadata: "x"}, co)
}

// TestObserveCommitsBesideEndedLogs: every log sees every commit, whatever
// other logs ended before it and whatever control functions drop themselves
// beside it. kfake skips the control function after one that removes itself
// during a request; with one control function per log, a log whose test had
// ended removed itself on the next commit and the log after it missed that
// commit.
func TestObserveCommitsBesideEndedLogs(t *testing.T) {
	c := Start(t)
	c.RequireEmbedded(t)
	topic := c.NewTopic(t, 1)
	t.Run("ended", func(t *testing.T) { c.ObserveCommits(t) })
	log := c.ObserveCommits(t)
	kf := c.Kfake()
	kf.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.DropControl() // a one-shot fault injector's way
		return nil, nil, false
	})
	t.Run("ended-too", func(t *testing.T) { c.ObserveCommits(t) })

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
	require.NoError(t, err)
	defer cl.Close()
	for i := range 3 {
		req := kmsg.NewPtrOffsetCommitRequest()
		req.Group = c.NewGroup(t)
		req.Generation = -1
		rt := kmsg.NewOffsetCommitRequestTopic()
		rt.Topic = topic
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Offset = int64(i)
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = req.RequestWith(ctx, cl)
		cancel()
		require.NoError(t, err)
		// The control function runs before the broker answers.
		require.Equal(t, i+1, log.Len(), "commit %d not observed", i)
	}
}

// NewTopic returns only once every partition's leader serves it. A real
// (KRaft) broker names a new partition's leader in Metadata before that
// leader has made the partition's log, and answers a ListOffsets or Fetch
// sent in between with NOT_LEADER_OR_FOLLOWER; Sarama's ConsumePartition
// retries its ListOffsets once, at once, and then fails. Each partition is
// asked once, straight to its leader, right after NewTopic.
func TestNewTopicServesAtOnce(t *testing.T) {
	c := Start(t)
	client, _ := c.clients(t)
	for range 20 {
		topic := c.NewTopic(t, 4)
		for p := range int32(4) {
			leader, err := client.Leader(topic, p)
			require.NoError(t, err)
			req := &sarama.OffsetRequest{Version: 1}
			req.AddBlock(topic, p, sarama.OffsetNewest, 1)
			resp, err := leader.GetAvailableOffsets(req)
			require.NoError(t, err)
			block := resp.GetBlock(topic, p)
			require.NotNil(t, block, "no answer for %s/%d", topic, p)
			require.Equal(t, sarama.ErrNoError, block.Err, "ListOffsets %s/%d right after NewTopic: %v", topic, p, block.Err)
		}
	}
}
