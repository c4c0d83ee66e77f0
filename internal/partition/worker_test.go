package partition

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack/frontier"
)

// These tests drive a Worker without a broker: a channel stands in for the
// claim, fakeMarker and fakePauser record what a Sarama session and
// consumer would be told. Broker behaviour is tested in the root package.

// waitLimit bounds every wait for the worker; none is expected to come
// near it.
const waitLimit = 5 * time.Second

type markCall struct {
	offset int64
	meta   string
	reset  bool // ResetOffset rather than MarkOffset
}

// fakeMarker records the marks, restarts and commits a worker makes.
type fakeMarker struct {
	mu       sync.Mutex
	marks    []markCall
	restarts []frontier.Tail
	commits  int
}

func (m *fakeMarker) Restart(_ int32, start int64, tail frontier.Tail) {
	m.mu.Lock()
	defer m.mu.Unlock()
	tail.Base = start // what the worker says the tail is relative to
	m.restarts = append(m.restarts, tail)
}

func (m *fakeMarker) restarted() []frontier.Tail {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.restarts)
}

func (m *fakeMarker) MarkOffset(_ string, _ int32, offset int64, meta string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.marks = append(m.marks, markCall{offset: offset, meta: meta})
}

func (m *fakeMarker) ResetOffset(_ string, _ int32, offset int64, meta string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.marks = append(m.marks, markCall{offset: offset, meta: meta, reset: true})
}

func (m *fakeMarker) Commit() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.commits++
}

// last returns the last mark, or -1 when none was made.
func (m *fakeMarker) last() markCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.marks) == 0 {
		return markCall{offset: -1}
	}
	return m.marks[len(m.marks)-1]
}

func (m *fakeMarker) all() []markCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.marks)
}

// fakePauser records pause state changes.
type fakePauser struct {
	mu              sync.Mutex
	paused          bool
	pauses, resumes int
}

func (p *fakePauser) Pause(map[string][]int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	p.pauses++
}

func (p *fakePauser) Resume(map[string][]int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
	p.resumes++
}

func (p *fakePauser) state() (paused bool, pauses, resumes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused, p.pauses, p.resumes
}

// rig is one worker running on a channel claim.
type rig struct {
	t      *testing.T
	w      *Worker
	claim  chan *sarama.ConsumerMessage
	out    chan *message.Message
	marker *fakeMarker
	pauser *fakePauser
	stop   chan struct{}
	done   chan struct{}
	next   int64 // offset of the next record send produces
}

type rigOptions struct {
	maxInFlight int
	config      func(*Config)
	start       Start
	noMarker    bool
	// beforeRun runs between New and Run (e.g. StartFromCommit).
	beforeRun func(*Worker)
	// firstRecords becomes Assignment.FirstRecords.
	firstRecords chan []*sarama.ConsumerMessage
	// startCommitted becomes Assignment.StartCommitted.
	startCommitted func(int64) bool
	// requestCommit becomes Assignment.RequestCommit.
	requestCommit func()
	// leaderEpoch becomes Assignment.LeaderEpoch.
	leaderEpoch func() int32
	// deliveries becomes Assignment.Deliveries.
	deliveries DeliveryHooks
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	cfg := &Config{
		Ordering:     Unordered,
		Seed:         maphash.MakeSeed(),
		Unmarshaler:  kafka.DefaultMarshaler{},
		MaxPending:   10_000,
		DrainTimeout: 50 * time.Millisecond, // the rig's shutdown abandons what is unanswered
		Logger:       watermill.NopLogger{},
	}
	if o.config != nil {
		o.config(cfg)
	}
	out := make(chan *message.Message)
	r := &rig{
		t:      t,
		claim:  make(chan *sarama.ConsumerMessage, 1024),
		out:    out,
		marker: &fakeMarker{},
		pauser: &fakePauser{},
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		next:   o.start.Offset,
	}
	a := Assignment{Topic: "t", Partition: 3, Start: o.start, Marker: r.marker, Pauser: r.pauser}
	if o.firstRecords != nil {
		a.FirstRecords = o.firstRecords
	}
	a.StartCommitted = o.startCommitted
	a.RequestCommit = o.requestCommit
	a.LeaderEpoch = o.leaderEpoch
	a.Deliveries = o.deliveries
	if o.noMarker {
		a.Marker = nil
	}
	w, err := New(context.Background(), cfg, NewPool(out, max(o.maxInFlight, 1)), a)
	require.NoError(t, err)
	r.w = w
	if o.beforeRun != nil {
		o.beforeRun(w)
	}
	go func() {
		defer close(r.done)
		w.Run(r.claim, r.stop)
	}()
	t.Cleanup(r.shutdown)
	return r
}

// send puts records with the given keys on the claim, at consecutive
// offsets.
func (r *rig) send(keys ...string) {
	for _, k := range keys {
		m := &sarama.ConsumerMessage{Topic: "t", Partition: 3, Offset: r.next, Value: []byte(fmt.Sprint(r.next))}
		if k != "" {
			m.Key = []byte(k)
		}
		r.claim <- m
		r.next++
	}
}

// records returns key-less records at offsets [from, to).
func records(from, to int64) []*sarama.ConsumerMessage {
	var out []*sarama.ConsumerMessage
	for o := from; o < to; o++ {
		out = append(out, &sarama.ConsumerMessage{Topic: "t", Partition: 3, Offset: o, Value: []byte(fmt.Sprint(o))})
	}
	return out
}

// sendN sends n key-less records.
func (r *rig) sendN(n int) {
	r.send(make([]string, n)...)
}

// receive returns the next message handed out.
func (r *rig) receive() *message.Message {
	r.t.Helper()
	select {
	case m := <-r.out:
		return m
	case <-time.After(waitLimit):
		r.t.Fatal("no message handed out")
		return nil
	}
}

// quiet asserts that nothing is handed out within d: the worker had every
// chance to (it hands out as soon as a token and a receiver are there).
func (r *rig) quiet(d time.Duration) {
	r.t.Helper()
	select {
	case m := <-r.out:
		r.t.Fatalf("offset %d handed out, want none", offsetOf(m))
	case <-time.After(d):
	}
}

// shutdown stops the worker and waits for its drain.
func (r *rig) shutdown() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	select {
	case <-r.done:
	case <-time.After(2 * waitLimit):
		r.t.Error("worker did not stop")
	}
}

func offsetOf(m *message.Message) int64 {
	rec, ok := FromContext(m.Context())
	if !ok {
		return -1
	}
	return rec.Message().Offset
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWorkerMarksOnlyTheCompletedPrefix: acks out of order never move the
// mark past an unacked record; the mark reaches the end once the head is
// acked.
func TestWorkerMarksOnlyTheCompletedPrefix(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 10, config: func(c *Config) { c.CompletedTail = false }})
	r.sendN(10)
	msgs := map[int64]*message.Message{}
	for range 10 {
		m := r.receive()
		msgs[offsetOf(m)] = m
	}
	for off := int64(9); off >= 1; off-- {
		msgs[off].Ack()
	}
	waitUntil(t, "acks 1-9 are completions", func() bool { return r.w.Stats().Counters.Completed == 9 })
	for _, mk := range r.marker.all() {
		require.LessOrEqual(t, mk.offset, int64(0), "marked past unacked offset 0")
	}
	msgs[0].Ack()
	waitUntil(t, "the prefix is marked at 10", func() bool { return r.marker.last().offset == 10 })
	st := r.w.Stats()
	require.Equal(t, int64(10), st.SafeOffset)
	require.Equal(t, 0, st.InFlight)
}

// TestWorkerWritesCompletedTail: with the tail on, a forced mark (the
// commit loop's) carries the completed records behind an unfinished head,
// and a previous owner's tail read back from the commit is not delivered.
func TestWorkerWritesCompletedTail(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 10, config: func(c *Config) {
		c.CompletedTail, c.TailBudget = true, frontier.DefaultMetadataBudget
	}})
	r.sendN(5)
	msgs := map[int64]*message.Message{}
	for range 5 {
		m := r.receive()
		msgs[offsetOf(m)] = m
	}
	msgs[2].Ack()
	msgs[4].Ack()
	waitUntil(t, "two completions", func() bool { return r.w.Stats().Counters.Completed == 2 })
	r.w.MarkTail()
	mk := r.marker.last()
	require.Equal(t, int64(0), mk.offset)
	tail, err := frontier.DecodeTail(mk.meta, 0)
	require.NoError(t, err)
	require.Equal(t, []frontier.Range{{From: 2, To: 3}, {From: 4, To: 5}}, tail.Ranges)

	// The next owner starts at 0 with that tail: 2 and 4 are not
	// delivered again, the others are.
	next := newRig(t, rigOptions{maxInFlight: 10,
		config: func(c *Config) { c.CompletedTail, c.TailBudget = true, frontier.DefaultMetadataBudget },
		start:  Start{Offset: 0, Resolved: true},
		beforeRun: func(w *Worker) {
			w.StartFromCommit(0, mk.meta)
		},
	})
	next.sendN(5)
	var got []int64
	for range 3 {
		got = append(got, offsetOf(next.receive()))
	}
	slices.Sort(got)
	require.Equal(t, []int64{0, 1, 3}, got)
	next.quiet(50 * time.Millisecond)
	st := next.w.Stats()
	require.Equal(t, uint64(2), st.Counters.SkippedTail)
	require.Equal(t, int64(0), st.ConfirmedOffset)
}

// TestWorkerMarksLeaderEpoch: every mark carries the leader epoch read at
// the mark, with the tail or alone; an epoch unknown at a mark keeps the
// last one known; the next owner reads the tail behind the epoch, and
// metadata with the epoch alone is no tail and nothing ignored.
func TestWorkerMarksLeaderEpoch(t *testing.T) {
	var epoch atomic.Int32
	epoch.Store(4)
	tailOn := func(c *Config) { c.CompletedTail, c.TailBudget = true, frontier.DefaultMetadataBudget }
	r := newRig(t, rigOptions{maxInFlight: 10, config: tailOn, leaderEpoch: epoch.Load})
	r.sendN(3)
	msgs := map[int64]*message.Message{}
	for range 3 {
		m := r.receive()
		msgs[offsetOf(m)] = m
	}
	msgs[0].Ack()
	waitUntil(t, "the prefix marked", func() bool { return r.marker.last().offset == 1 })
	require.Equal(t, "sa2:4", r.marker.last().meta, "a mark without a tail carries the epoch alone")

	epoch.Store(-1) // the leader unknown at the next mark
	msgs[2].Ack()
	waitUntil(t, "two completions", func() bool { return r.w.Stats().Counters.Completed == 2 })
	r.w.MarkTail()
	mk := r.marker.last()
	require.Equal(t, int64(1), mk.offset)
	got, ok := frontier.LeaderEpochOf(mk.meta)
	require.True(t, ok)
	require.Equal(t, int32(4), got, "an unknown epoch keeps the last one known")
	tail, err := frontier.DecodeTail(mk.meta, 1)
	require.NoError(t, err)
	require.Equal(t, []frontier.Range{{From: 2, To: 3}}, tail.Ranges)

	for _, meta := range []string{mk.meta, "sa2:4"} {
		next := newRig(t, rigOptions{maxInFlight: 10, config: tailOn, start: Start{Offset: 1, Resolved: true},
			beforeRun: func(w *Worker) { w.StartFromCommit(1, meta) }})
		next.claim <- records(1, 2)[0]
		require.Equal(t, int64(1), offsetOf(next.receive()))
		require.Zero(t, next.w.Stats().Counters.IgnoredMetadata, "metadata %q", meta)
	}
}

// TestWorkerIgnoresForeignMetadata: metadata that is not a tail relative
// to the start is counted and ignored: every record is delivered.
func TestWorkerIgnoresForeignMetadata(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 10,
		config:    func(c *Config) { c.CompletedTail, c.TailBudget = true, frontier.DefaultMetadataBudget },
		start:     Start{Offset: 0, Resolved: true},
		beforeRun: func(w *Worker) { w.StartFromCommit(0, "some other client's metadata") },
	})
	r.sendN(3)
	for range 3 {
		r.receive()
	}
	require.Equal(t, uint64(1), r.w.Stats().Counters.IgnoredMetadata)
}

// TestWorkerNackRedeliversFirst: a nacked record is handed out again
// before any record behind it, and counted.
func TestWorkerNackRedeliversFirst(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 1})
	r.sendN(3)
	m := r.receive()
	require.Equal(t, int64(0), offsetOf(m))
	m.Nack()
	again := r.receive()
	require.Equal(t, int64(0), offsetOf(again))
	require.NotSame(t, m, again, "a redelivery is a fresh message")
	again.Ack()
	require.Equal(t, int64(1), offsetOf(r.receive()))
	require.Equal(t, uint64(1), r.w.Stats().Counters.Redeliveries)
}

// TestWorkerKeyOrdering: under ByKey a record waits for the one before it
// with the same key, records of other keys pass it, and key-less records
// run one at a time.
func TestWorkerKeyOrdering(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 10, config: func(c *Config) { c.Ordering = ByKey }})
	r.send("a", "a", "b", "", "")
	first := map[int64]*message.Message{}
	for range 3 {
		m := r.receive()
		first[offsetOf(m)] = m
	}
	require.Contains(t, first, int64(0))
	require.Contains(t, first, int64(2))
	require.Contains(t, first, int64(3))
	r.quiet(50 * time.Millisecond) // 1 waits for 0, 4 for 3
	require.Equal(t, 2, r.w.Stats().WaitingForKey)
	first[0].Ack()
	require.Equal(t, int64(1), offsetOf(r.receive()))
	first[3].Ack()
	require.Equal(t, int64(4), offsetOf(r.receive()))
}

// TestWorkerPausesFetchingWhileRecordsWait: records no handler takes pile
// up in the fetched queue; fetching pauses, and resumes once they are
// taken.
func TestWorkerPausesFetchingWhileRecordsWait(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 1})
	// Three records are out of the fetched queue: handed out, being sent
	// and ready.
	const n = 2*minResumeBelow + 3
	r.sendN(n)
	waitUntil(t, "fetching paused", func() bool { p, _, _ := r.pauser.state(); return p })
	for range n {
		r.receive().Ack()
	}
	waitUntil(t, "fetching resumed", func() bool { p, _, res := r.pauser.state(); return !p && res == 1 })
}

// TestWorkerTokensBoundInFlight: no more messages are unanswered than the
// pool has tokens, and a freed token hands out the next record.
func TestWorkerTokensBoundInFlight(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 3})
	r.sendN(10)
	held := []*message.Message{r.receive(), r.receive(), r.receive()}
	r.quiet(50 * time.Millisecond)
	require.Equal(t, 3, r.w.Stats().InFlight)
	held[1].Ack()
	require.Equal(t, int64(3), offsetOf(r.receive()))
}

// TestWorkerDrainWaitsThenAbandons: at stop, a running handler may still
// ack within DrainTimeout and its ack is marked and committed; one that
// does not is abandoned: its context is cancelled and the final mark stays
// before it.
func TestWorkerDrainWaitsThenAbandons(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 10, config: func(c *Config) {
		c.DrainTimeout = time.Second
	}})
	r.sendN(3)
	m0, m1, m2 := r.receive(), r.receive(), r.receive()
	m0.Ack()
	close(r.stop)
	// The drain has begun once the assignment reads as ended.
	rec1, _ := FromContext(m1.Context())
	waitUntil(t, "the drain began", rec1.AssignmentEnded)
	require.NoError(t, m1.Context().Err(), "a message context must outlive the start of the drain")
	m1.Ack()
	select {
	case <-r.done:
	case <-time.After(waitLimit):
		t.Fatal("drain did not give up")
	}
	require.Error(t, m2.Context().Err(), "an abandoned message's context must be cancelled")
	require.Equal(t, int64(2), r.marker.last().offset, "the final mark must cover acked 0 and 1, not unanswered 2")
	r.marker.mu.Lock()
	commits := r.marker.commits
	r.marker.mu.Unlock()
	require.Positive(t, commits, "the final prefix must be committed")
	m2.Ack() // late: changes nothing
	require.Equal(t, int64(2), r.marker.last().offset)
}

// TestWorkerClaimClosedAtCapacity: a closed claim (a cooperative
// revocation) ends the worker even when it cannot take a record.
func TestWorkerClaimClosedAtCapacity(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 1, noMarker: true})
	r.sendN(100)
	m := r.receive()
	close(r.claim)
	select {
	case <-r.done:
	case <-time.After(waitLimit):
		t.Fatal("worker kept running after its claim closed")
	}
	require.Error(t, m.Context().Err())
}

// failingUnmarshaler rejects the record at one offset until fixed.
type failingUnmarshaler struct {
	mu    sync.Mutex
	bad   int64
	fixed bool
}

func (u *failingUnmarshaler) Unmarshal(m *sarama.ConsumerMessage) (*message.Message, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if m.Offset == u.bad && !u.fixed {
		return nil, errors.New("bad record")
	}
	return kafka.DefaultMarshaler{}.Unmarshal(m)
}

// TestWorkerStopsAtUnmarshalError: a rejected record stops the partition
// (nothing after it is taken) until a retry succeeds.
func TestWorkerStopsAtUnmarshalError(t *testing.T) {
	u := &failingUnmarshaler{bad: 1}
	r := newRig(t, rigOptions{maxInFlight: 10, config: func(c *Config) {
		c.Unmarshaler = u
		c.UnmarshalRetry = 10 * time.Millisecond
	}})
	r.sendN(3)
	r.receive().Ack()
	r.quiet(50 * time.Millisecond)
	st := r.w.Stats()
	require.True(t, st.Stuck)
	require.Positive(t, st.Counters.UnmarshalFailures)
	u.mu.Lock()
	u.fixed = true
	u.mu.Unlock()
	require.Equal(t, int64(1), offsetOf(r.receive()))
	require.Equal(t, int64(2), offsetOf(r.receive()))
	require.False(t, r.w.Stats().Stuck)
}

// TestWorkerOnUnmarshalErrorCompletes: OnUnmarshalError returning nil
// completes the rejected record without delivering it.
func TestWorkerOnUnmarshalErrorCompletes(t *testing.T) {
	var handed []int64
	r := newRig(t, rigOptions{maxInFlight: 10, config: func(c *Config) {
		c.Unmarshaler = &failingUnmarshaler{bad: 0}
		c.UnmarshalRetry = time.Millisecond
		c.CompletedTail = false
		c.OnUnmarshalError = func(_ context.Context, m *sarama.ConsumerMessage, _ error) error {
			handed = append(handed, m.Offset) // only run calls it
			return nil
		}
	}})
	r.sendN(2)
	m := r.receive()
	require.Equal(t, int64(1), offsetOf(m))
	m.Ack()
	waitUntil(t, "both records complete", func() bool { return r.marker.last().offset == 2 })
	require.Equal(t, []int64{0}, handed)
}

// TestWorkerDeferral: a deferred delivery's ack frees its token but leaves
// the record unfinished until the Deferral resolves; a failed one is
// redelivered.
func TestWorkerDeferral(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 1, config: func(c *Config) { c.CompletedTail = false }})
	r.sendN(2)
	m0 := r.receive()
	rec, ok := FromContext(m0.Context())
	require.True(t, ok)
	d, ok := rec.Defer(m0, nil)
	require.True(t, ok)
	again, _ := rec.Defer(m0, nil)
	require.Same(t, d, again, "deferring a delivery twice gives the same Deferral")
	m0.Ack()
	m1 := r.receive() // the token is free again
	require.Equal(t, int64(1), offsetOf(m1))
	m1.Ack()
	r.quiet(20 * time.Millisecond)
	require.Equal(t, int64(0), r.w.Stats().SafeOffset, "a deferred record must hold the prefix")

	d.Resolve(errors.New("write failed"))
	m0b := r.receive()
	require.Equal(t, int64(0), offsetOf(m0b))
	rec.Defer(m0b, nil)
	d2, _ := rec.Defer(m0b, nil)
	m0b.Ack()
	d2.Resolve(nil)
	d2.Resolve(errors.New("ignored: the first resolution wins"))
	waitUntil(t, "the prefix passes both", func() bool { return r.marker.last().offset == 2 })
	_, ok = rec.Defer(m0b, nil)
	require.False(t, ok, "an answered delivery cannot be deferred")
	require.Equal(t, uint64(2), r.w.Stats().Counters.Deferred)
}

// TestWorkerSkipIfEnded: a message whose assignment ended before its
// handler ran is nacked without a redelivery.
func TestWorkerSkipIfEnded(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 2, config: func(c *Config) { c.DrainTimeout = 100 * time.Millisecond }})
	r.sendN(2)
	m := r.receive()
	rec, _ := FromContext(m.Context())
	require.False(t, rec.SkipIfEnded(m), "skipped while the assignment runs")
	r.w.End()
	waitUntil(t, "the assignment ended", rec.AssignmentEnded)
	require.True(t, rec.SkipIfEnded(m))
	require.True(t, rec.Skipped())
	<-r.done
	st := r.w.Stats()
	require.Equal(t, uint64(1), st.Counters.SkippedRevoked)
	require.Zero(t, st.Counters.Redeliveries)
}

// TestWorkerFixesUnresolvedStart: when Sarama resolved the start itself,
// the first record fixes it and its position is committed before it is
// handed out.
func TestWorkerFixesUnresolvedStart(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 1, start: Start{Offset: 40, Resolved: false}})
	require.Equal(t, int64(-1), r.w.Marked())
	r.next = 42 // the first record that exists
	r.sendN(1)
	m := r.receive()
	marks := r.marker.all()
	require.GreaterOrEqual(t, len(marks), 2)
	require.Equal(t, markCall{offset: 42}, marks[0])
	require.Equal(t, markCall{offset: 42, reset: true}, marks[1])
	require.Equal(t, int64(42), r.w.Marked())
	m.Ack()
	waitUntil(t, "marked past the first record", func() bool { return r.marker.last().offset == 43 })
}

// TestWorkerHandsOutOnlyACommittedStart: a start fixed at the first record
// is committed again until the coordinator holds it, and nothing is handed
// out before.
func TestWorkerHandsOutOnlyACommittedStart(t *testing.T) {
	var held sync.Mutex
	holds := false
	var asked []int64
	r := newRig(t, rigOptions{maxInFlight: 1, start: Start{Offset: 40, Resolved: false},
		startCommitted: func(off int64) bool {
			held.Lock()
			defer held.Unlock()
			asked = append(asked, off)
			return holds
		}})
	r.next = 42
	r.sendN(1)
	waitUntil(t, "the start read back twice", func() bool {
		held.Lock()
		defer held.Unlock()
		return len(asked) >= 2
	})
	r.quiet(20 * time.Millisecond)
	held.Lock()
	holds = true
	held.Unlock()
	m := r.receive()
	require.Equal(t, int64(42), offsetOf(m))
	r.marker.mu.Lock()
	commits := r.marker.commits
	r.marker.mu.Unlock()
	require.GreaterOrEqual(t, commits, 2, "the start is committed again after each refusal")
	held.Lock()
	require.Equal(t, int64(42), asked[0])
	held.Unlock()
	m.Ack()
}

// TestWorkersShareTokens: two workers of one pool never have more
// messages unanswered together than the pool's tokens.
func TestWorkersShareTokens(t *testing.T) {
	cfg := &Config{Ordering: Unordered, Seed: maphash.MakeSeed(), Unmarshaler: kafka.DefaultMarshaler{},
		MaxPending: 100, DrainTimeout: 0, Logger: watermill.NopLogger{}}
	out := make(chan *message.Message)
	pool := NewPool(out, 4)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range int32(2) {
		w, err := New(context.Background(), cfg, pool, Assignment{Topic: "t", Partition: p, Start: Start{Resolved: true}})
		require.NoError(t, err)
		claim := make(chan *sarama.ConsumerMessage, 10)
		for o := range int64(10) {
			claim <- &sarama.ConsumerMessage{Topic: "t", Partition: p, Offset: o}
		}
		wg.Go(func() { w.Run(claim, stop) })
	}
	defer func() { close(stop); wg.Wait() }()
	var held []*message.Message
	for range 4 {
		select {
		case m := <-out:
			held = append(held, m)
		case <-time.After(waitLimit):
			t.Fatal("no message handed out")
		}
	}
	select {
	case m := <-out:
		t.Fatalf("a fifth message (offset %d) was handed out with 4 tokens", offsetOf(m))
	case <-time.After(50 * time.Millisecond):
	}
	held[0].Ack()
	select {
	case <-out:
	case <-time.After(waitLimit):
		t.Fatal("a freed token did not hand out the next record")
	}
}

// TestWorkerAtShareTakesAnIdleToken: a partition at its share of the
// tokens with records ready takes a token another partition frees with
// nothing of its own to hand out. Before, it waited for its own acks to
// pass a token on, and the freed tokens stayed free: its handlers waiting
// for its next records (a Batcher bounded by MaxInFlight) never returned.
func TestWorkerAtShareTakesAnIdleToken(t *testing.T) {
	cfg := &Config{Ordering: Unordered, Seed: maphash.MakeSeed(), Unmarshaler: kafka.DefaultMarshaler{},
		MaxPending: 100, DrainTimeout: 0, Logger: watermill.NopLogger{}}
	out := make(chan *message.Message)
	pool := NewPool(out, 4)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	run := func(p int32, n int64) {
		w, err := New(context.Background(), cfg, pool, Assignment{Topic: "t", Partition: p, Start: Start{Resolved: true}})
		require.NoError(t, err)
		claim := make(chan *sarama.ConsumerMessage, n)
		for o := range n {
			claim <- &sarama.ConsumerMessage{Topic: "t", Partition: p, Offset: o}
		}
		wg.Go(func() { w.Run(claim, stop) })
	}
	take := func(what string) *message.Message {
		t.Helper()
		select {
		case m := <-out:
			return m
		case <-time.After(waitLimit):
			t.Fatal(what)
			return nil
		}
	}
	run(0, 2) // alone: its share is every token
	idle := []*message.Message{take("partition 0's first record"), take("partition 0's second record")}
	run(1, 4) // its share: the 2 tokens left
	take("partition 1's first record")
	take("partition 1's second record")
	select {
	case m := <-out:
		t.Fatalf("a fifth message (offset %d) was handed out with 4 tokens", offsetOf(m))
	case <-time.After(50 * time.Millisecond):
	}
	for _, m := range idle {
		m.Ack() // partition 0 has nothing more: its tokens go back to the pool
	}
	take("partition 1's third record, with a token partition 0 freed")
	take("partition 1's fourth record, with a token partition 0 freed")
}

// TestWorkerTakesFirstRecordsBeforeTheClaim: records fetched early are
// handed out before the claim delivers anything, and the claim's copies of
// them are dropped: every offset is handed out once, in order.
func TestWorkerTakesFirstRecordsBeforeTheClaim(t *testing.T) {
	first := make(chan []*sarama.ConsumerMessage, 1)
	r := newRig(t, rigOptions{maxInFlight: 1, start: Start{Offset: 10, Resolved: true}, firstRecords: first,
		config: func(c *Config) { c.Ordering = ByPartition }})
	first <- records(10, 15)
	for want := int64(10); want < 15; want++ {
		m := r.receive()
		require.Equal(t, want, offsetOf(m))
		m.Ack()
	}
	r.sendN(8) // the claim fetches from the start again: 10..17
	for want := int64(15); want < 18; want++ {
		m := r.receive()
		require.Equal(t, want, offsetOf(m), "the claim's copies of the first records are dropped")
		m.Ack()
	}
	r.quiet(20 * time.Millisecond)
	waitUntil(t, "the prefix is marked at 18", func() bool { return r.marker.last().offset == 18 })
}

// TestWorkerIgnoresFirstRecordsAfterTheClaim: once the claim delivered a
// record, first records arriving late change nothing.
func TestWorkerIgnoresFirstRecordsAfterTheClaim(t *testing.T) {
	first := make(chan []*sarama.ConsumerMessage, 1)
	r := newRig(t, rigOptions{maxInFlight: 1, start: Start{Offset: 0, Resolved: true}, firstRecords: first,
		config: func(c *Config) { c.Ordering = ByPartition }})
	r.sendN(3)
	m := r.receive()
	require.Equal(t, int64(0), offsetOf(m))
	first <- records(0, 3)
	m.Ack()
	for want := int64(1); want < 3; want++ {
		m := r.receive()
		require.Equal(t, want, offsetOf(m))
		m.Ack()
	}
	r.quiet(20 * time.Millisecond)
	r.sendN(1)
	require.Equal(t, int64(3), offsetOf(r.receive()))
}
