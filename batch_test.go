package safeack_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// The Batcher's tests: each runs a Watermill router with a Batch handler
// on a subscriber of the test broker, and checks what the batch function
// saw, what each message's handler returned, and the commits the broker
// received.

// batchLog records each call of a batch function: the positions of its
// messages, and when it returned.
type batchLog struct {
	mu      sync.Mutex
	batches [][]po
	calls   map[po]int
	done    *doneLog
}

func newBatchLog() *batchLog { return &batchLog{calls: make(map[po]int), done: newDoneLog()} }

// saw records a call with msgs and returns its index.
func (l *batchLog) saw(t *testing.T, msgs []*message.Message) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := make([]po, len(msgs))
	for i, m := range msgs {
		b[i] = mwOffset(t, m)
		l.calls[b[i]]++
	}
	l.batches = append(l.batches, b)
	return len(l.batches) - 1
}

// succeeded marks every message of msgs but those in failed done, as the
// batch function is about to return.
func (l *batchLog) succeeded(t *testing.T, msgs []*message.Message, failed ...*message.Message) {
	for _, m := range msgs {
		if !containsMsg(failed, m) {
			l.done.done(mwOffset(t, m))
		}
	}
}

func containsMsg(ms []*message.Message, m *message.Message) bool {
	for _, x := range ms {
		if x == m {
			return true
		}
	}
	return false
}

func (l *batchLog) all() [][]po {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]po(nil), l.batches...)
}

func (l *batchLog) count(k po) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[k]
}

// batchRig is a broker, a topic, a group and a subscriber of it.
func batchRig(t *testing.T, partitions int, mod func(*safeack.SubscriberConfig)) (*kafkatest.Cluster, string, string, *safeack.Subscriber, *kafkatest.CommitLog) {
	t.Helper()
	c, topic, group := kafkatest.StartTopic(t, partitions)
	var commits *kafkatest.CommitLog
	if c.CanObserveCommits() {
		commits = c.ObserveCommits(t)
	}
	sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Ordering = safeack.Unordered
		if mod != nil {
			mod(cfg)
		}
	})
	return c, topic, group, sub, commits
}

// batchCheckCommits checks every commit the embedded broker saw against the
// records' batches (none passes a record whose batch had not returned) and
// that there were some; a real cluster cannot be observed, and the tests'
// waits for committed offsets stand alone there.
func batchCheckCommits(t *testing.T, commits *kafkatest.CommitLog, group, topic string, done *doneLog) {
	t.Helper()
	if n := mwCheckCommits(t, commits, group, topic, done); commits != nil {
		assert.Positive(t, n, "commits observed at the broker")
	}
}

func newBatcher(t *testing.T, cfg safeack.BatchConfig, fn safeack.BatchFunc) *safeack.Batcher {
	t.Helper()
	b, err := safeack.NewBatcher(cfg, fn)
	require.NoError(t, err)
	return b
}

// TestBatchConfigValidate: negative sizes and durations and a nil function
// are refused with an error naming the field.
func TestBatchConfigValidate(t *testing.T) {
	fn := func(context.Context, []*message.Message) error { return nil }
	for field, cfg := range map[string]safeack.BatchConfig{
		"MaxSize":       {MaxSize: -1},
		"MaxWait":       {MaxWait: -time.Second},
		"MaxConcurrent": {MaxConcurrent: -2},
	} {
		_, err := safeack.NewBatcher(cfg, fn)
		require.ErrorIs(t, err, safeack.ErrInvalidConfig, field)
		assert.Contains(t, err.Error(), field)
	}
	_, err := safeack.NewBatcher(safeack.BatchConfig{}, nil)
	assert.Error(t, err)
	assert.Panics(t, func() { safeack.Batch(safeack.BatchConfig{MaxSize: -1}, fn) })
	require.NoError(t, safeack.BatchConfig{}.Validate())
}

// TestBatchMaxSizeOne: with MaxSize 1 every message runs in a batch of its
// own, each is handled once, and the group commits them all, never past a
// record whose batch had not returned.
func TestBatchMaxSizeOne(t *testing.T) {
	t.Parallel()
	c, topic, group, sub, commits := batchRig(t, 2, nil)
	log := newBatchLog()
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 1, MaxWait: time.Minute}, func(_ context.Context, msgs []*message.Message) error {
		log.saw(t, msgs)
		log.succeeded(t, msgs)
		return nil
	})
	c.ProduceN(t, topic, 2, 20, nil)
	mwRouter(t, sub, topic, b.Handler())
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 10, 1: 10})
	for _, bt := range log.all() {
		assert.Len(t, bt, 1)
	}
	st := b.Stats()
	assert.Equal(t, int64(20), st.Batches)
	assert.Equal(t, int64(20), st.Full)
	assert.Equal(t, 1, st.MaxSeen)
	batchCheckCommits(t, commits, group, topic, log.done)
}

// TestBatchPartialFailure: the batch function fails one message of many
// with a BatchError: only that message's handler returns an error (its
// own), only it is delivered again, alone in a later batch, and the
// others are acked once; no commit passes it before its second batch
// returned.
func TestBatchPartialFailure(t *testing.T) {
	t.Parallel()
	c, topic, group, sub, commits := batchRig(t, 1, func(cfg *safeack.SubscriberConfig) { cfg.MaxInFlight = 20 })
	log := newBatchLog()
	bad := po{0, 7}
	errBad := errors.New("row 7 refused")
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 20, MaxWait: 2 * time.Second}, func(_ context.Context, msgs []*message.Message) error {
		log.saw(t, msgs)
		for _, m := range msgs {
			if mwOffset(t, m) == bad && log.count(bad) == 1 {
				log.succeeded(t, msgs, m)
				be := new(safeack.BatchError).Fail(m, errBad)
				return fmt.Errorf("writing: %w", be) // wrapped: still found
			}
		}
		log.succeeded(t, msgs)
		return nil
	})
	c.ProduceN(t, topic, 1, 20, nil)
	errs := make(chan error, 10)
	mwRouter(t, sub, topic, b.Handler(), errorsTo(errs))
	// The first batch runs once it holds the 20 records (MaxSize, and
	// MaxInFlight); the failed one then collects alone for MaxWait.
	kafkatest.WaitFor(t, mwWait, "the failed record handled again", func() bool { return log.count(bad) == 2 })
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 20})
	batches := log.all()
	require.Len(t, batches, 2)
	assert.Len(t, batches[0], 20)
	assert.Equal(t, []po{bad}, batches[1])
	for o := range int64(20) {
		assert.Equal(t, map[bool]int{true: 2, false: 1}[o == 7], log.count(po{0, o}), "calls of offset %d", o)
	}
	require.Len(t, errs, 1)
	assert.ErrorIs(t, <-errs, errBad)
	assert.Equal(t, int64(1), b.Stats().Failed)
	batchCheckCommits(t, commits, group, topic, log.done)
}

// TestBatchPanic: a batch function that panics fails every message of its
// batch with an error wrapping ErrHandlerPanicked; the process goes on,
// the messages are delivered again, and the next batch writes them.
func TestBatchPanic(t *testing.T) {
	t.Parallel()
	c, topic, group, sub, commits := batchRig(t, 1, func(cfg *safeack.SubscriberConfig) { cfg.MaxInFlight = 5 })
	log := newBatchLog()
	var calls int
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 5, MaxWait: time.Minute}, func(_ context.Context, msgs []*message.Message) error {
		log.saw(t, msgs)
		calls++ // one batch at a time (MaxConcurrent 1)
		if calls == 1 {
			panic("boom")
		}
		log.succeeded(t, msgs)
		return nil
	})
	c.ProduceN(t, topic, 1, 5, nil)
	errs := make(chan error, 10)
	mwRouter(t, sub, topic, b.Handler(), errorsTo(errs))
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 5})
	batches := log.all()
	require.Len(t, batches, 2)
	assert.Len(t, batches[0], 5)
	assert.ElementsMatch(t, batches[0], batches[1])
	require.Len(t, errs, 5)
	for range 5 {
		err := <-errs
		assert.ErrorIs(t, err, safeack.ErrHandlerPanicked)
		assert.Contains(t, err.Error(), "boom")
	}
	st := b.Stats()
	assert.Equal(t, int64(1), st.Panics)
	assert.Equal(t, int64(5), st.Failed)
	assert.Equal(t, int64(2), st.Full, "both batches ran as they held MaxSize")
	batchCheckCommits(t, commits, group, topic, log.done)
}

// TestBatchNeverReturns: a batch function that never returns holds its
// messages until the drain gives up at Close (DrainTimeout): their
// handlers then return, nothing is committed for them, the run slot is
// freed, and the group's next member handles them all.
func TestBatchNeverReturns(t *testing.T) {
	t.Parallel()
	const drain = time.Second
	c, topic, group, sub, _ := batchRig(t, 1, func(cfg *safeack.SubscriberConfig) {
		cfg.MaxInFlight = 4
		cfg.DrainTimeout = drain
	})
	stuck := make(chan struct{})
	defer close(stuck)
	entered := make(chan int, 1)
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 4, MaxWait: time.Minute}, func(ctx context.Context, msgs []*message.Message) error {
		entered <- len(msgs)
		<-stuck // ignores ctx too
		return nil
	})
	c.ProduceN(t, topic, 1, 4, nil)
	errs := make(chan error, 10)
	r := mwRouter(t, sub, topic, b.Handler(), errorsTo(errs))
	assert.Equal(t, 4, receive(t, entered, mwWait, "batch function not called"))

	start := time.Now()
	require.NoError(t, sub.Close())
	took := time.Since(start)
	assert.Less(t, took, drain+5*time.Second, "Close waited for the stuck batch past DrainTimeout")
	kafkatest.WaitFor(t, mwWait, "the stuck batch's handlers returned", func() bool { return len(errs) == 4 })
	for range 4 {
		assert.ErrorIs(t, <-errs, context.Canceled)
	}
	st := b.Stats()
	assert.Equal(t, int64(1), st.Abandoned)
	assert.Zero(t, st.Running)
	_ = r.Close()
	assert.Zero(t, c.CommittedOffsets(t, group, topic)[0].Offset, "committed past records the stuck batch never finished")

	// The next member of the group gets all four records.
	sub2 := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
	log := newBatchLog()
	mwRouter(t, sub2, topic, safeack.Batch(safeack.BatchConfig{MaxSize: 4}, func(_ context.Context, msgs []*message.Message) error {
		log.saw(t, msgs)
		return nil
	}))
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 4})
	for o := range int64(4) {
		assert.Equal(t, 1, log.count(po{0, o}))
	}
}

// TestBatchMaxWaitOne: a lone message waits MaxWait for company, then runs
// in a batch of one.
func TestBatchMaxWaitOne(t *testing.T) {
	t.Parallel()
	const wait = 300 * time.Millisecond
	c, topic, group, sub, _ := batchRig(t, 1, nil)
	ran := make(chan time.Duration, 1)
	var joined time.Time // written before the handler joins, read by the batch
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 100, MaxWait: wait}, func(_ context.Context, msgs []*message.Message) error {
		ran <- time.Since(joined)
		return nil
	})
	c.ProduceN(t, topic, 1, 1, nil)
	h := b.Handler()
	mwRouter(t, sub, topic, func(msg *message.Message) error {
		joined = time.Now()
		return h(msg)
	})
	assert.GreaterOrEqual(t, receive(t, ran, mwWait, "the batch never ran"), wait)
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 1})
	st := b.Stats()
	assert.Equal(t, int64(1), st.Waited)
	assert.Equal(t, 1, st.LastSize)
}

// TestBatchBoundedByMaxInFlight: MaxSize far above MaxInFlight, and a
// MaxWait the test would not outlive: each batch runs as soon as it holds
// every message the subscription can hand out, so nothing waits.
func TestBatchBoundedByMaxInFlight(t *testing.T) {
	t.Parallel()
	c, topic, group, sub, commits := batchRig(t, 4, func(cfg *safeack.SubscriberConfig) { cfg.MaxInFlight = 8 })
	log := newBatchLog()
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 1000, MaxWait: time.Hour}, func(_ context.Context, msgs []*message.Message) error {
		log.saw(t, msgs)
		log.succeeded(t, msgs)
		return nil
	})
	c.ProduceN(t, topic, 4, 80, nil)
	mwRouter(t, sub, topic, b.Handler())
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 20, 1: 20, 2: 20, 3: 20})
	for _, bt := range log.all() {
		assert.Len(t, bt, 8)
	}
	st := b.Stats()
	assert.Equal(t, int64(10), st.Bounded)
	assert.Zero(t, st.Waited)
	batchCheckCommits(t, commits, group, topic, log.done)
}

// TestBatchFlushedAtClose: a batch still collecting when the subscriber
// closes runs at once, within the drain, and its records are committed
// before Close returns.
func TestBatchFlushedAtClose(t *testing.T) {
	t.Parallel()
	c, topic, group, sub, commits := batchRig(t, 2, func(cfg *safeack.SubscriberConfig) { cfg.DrainTimeout = 5 * time.Second })
	log := newBatchLog()
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 1000, MaxWait: time.Hour}, func(_ context.Context, msgs []*message.Message) error {
		log.saw(t, msgs)
		log.succeeded(t, msgs)
		return nil
	})
	c.ProduceN(t, topic, 2, 10, nil)
	mwRouter(t, sub, topic, b.Handler())
	kafkatest.WaitFor(t, mwWait, "all ten collecting", func() bool { return b.Stats().Collecting == 10 })
	require.NoError(t, sub.Close())
	assert.Equal(t, map[int32]int64{0: 5, 1: 5}, map[int32]int64{
		0: c.CommittedOffsets(t, group, topic)[0].Offset,
		1: c.CommittedOffsets(t, group, topic)[1].Offset,
	})
	st := b.Stats()
	assert.Equal(t, int64(1), st.Batches)
	assert.Positive(t, st.Ending)
	batchCheckCommits(t, commits, group, topic, log.done)
}

// TestBatchShare: on a ShareSubscriber, a batch runs once it holds every
// message the subscription hands out (MaxInFlight); a message the batch
// function fails is released and comes back with its delivery count one
// higher (alone: it runs after MaxWait), the others are accepted once.
func TestBatchShare(t *testing.T) {
	t.Parallel()
	c := startShareCluster(t, 0)
	topic := c.NewTopic(t, 1)
	sub := newShareSub(t, c, c.NewGroup(t), func(cfg *safeack.ShareSubscriberConfig) { cfg.MaxInFlight = 8 })
	var mu sync.Mutex
	seen := map[int64][]int32{} // offset: delivery counts
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 100, MaxWait: 200 * time.Millisecond}, func(_ context.Context, msgs []*message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		var be safeack.BatchError
		for _, m := range msgs {
			off, _ := safeack.MessagePartitionOffsetFromCtx(m.Context())
			n, _ := safeack.MessageDeliveryCountFromCtx(m.Context())
			seen[off] = append(seen[off], n)
			if off == 3 && n == 1 {
				be.Fail(m, errors.New("refused"))
			}
		}
		if be.Len() > 0 {
			return &be
		}
		return nil
	})
	c.ProduceN(t, topic, 1, 16, nil)
	mwRouter(t, sub, topic, b.Handler())
	kafkatest.WaitFor(t, mwWait, "all accepted", func() bool {
		tot, inFlight := shareTotals(sub)
		return tot.Accepted == 16 && inFlight == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for o := range int64(16) {
		want := []int32{1}
		if o == 3 {
			want = []int32{1, 2}
		}
		assert.Equal(t, want, seen[o], "delivery counts of offset %d", o)
	}
	st := b.Stats()
	assert.GreaterOrEqual(t, st.Bounded, int64(1), "a batch ran as it held MaxInFlight messages")
	assert.Equal(t, 8, st.MaxSeen)
	assert.Equal(t, int64(1), st.Failed)
}

// TestBatchSkipsEndedAssignment: a message whose assignment ended before
// it reached the batch handler (here held back by a middleware until
// Close began) is skipped, as SkipRevoked skips it: never written, not
// committed past, and handled by the group's next member.
func TestBatchSkipsEndedAssignment(t *testing.T) {
	t.Parallel()
	c, topic, group, sub, _ := batchRig(t, 1, func(cfg *safeack.SubscriberConfig) {
		cfg.MaxInFlight = 3
		cfg.DrainTimeout = 5 * time.Second
	})
	log := newBatchLog()
	b := newBatcher(t, safeack.BatchConfig{MaxSize: 2, MaxWait: time.Minute}, func(_ context.Context, msgs []*message.Message) error {
		log.saw(t, msgs)
		return nil
	})
	c.ProduceN(t, topic, 1, 3, nil)
	h := b.Handler()
	mwRouter(t, sub, topic, func(msg *message.Message) error {
		if mwOffset(t, msg).o == 2 {
			kafkatest.WaitFor(t, mwWait, "the assignment to end", func() bool { return safeack.AssignmentEnded(msg) })
		}
		return h(msg)
	})
	kafkatest.WaitFor(t, mwWait, "offsets 0 and 1 written", func() bool { return log.count(po{0, 0}) == 1 && log.count(po{0, 1}) == 1 })
	require.NoError(t, sub.Close())
	assert.Zero(t, log.count(po{0, 2}), "written after its assignment ended")
	assert.Equal(t, int64(1), b.Stats().Skipped)
	assert.Equal(t, int64(2), c.CommittedOffsets(t, group, topic)[0].Offset)

	sub2 := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) { cfg.Ordering = safeack.Unordered })
	mwRouter(t, sub2, topic, safeack.Batch(safeack.BatchConfig{MaxSize: 1}, func(_ context.Context, msgs []*message.Message) error {
		log.saw(t, msgs)
		return nil
	}))
	mwWaitCommitted(t, c, group, topic, map[int32]int64{0: 3})
	assert.Equal(t, 1, log.count(po{0, 2}))
	assert.Equal(t, 1, log.count(po{0, 0}), "the next member handled a record the first had committed")
}
