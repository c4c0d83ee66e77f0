package partition

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
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

// Paths where answers race the end of an assignment, records with holes
// between their offsets, the pending bound, untrusted commit metadata and
// the tail budget.

// sendAt puts key-less records at the given offsets on the claim.
func (r *rig) sendAt(offsets ...int64) {
	for _, off := range offsets {
		r.claim <- &sarama.ConsumerMessage{Topic: "t", Partition: 3, Offset: off, Value: []byte(fmt.Sprint(off))}
		r.next = off + 1
	}
}

// stopped stops the worker and waits, at most waitLimit, for its drain.
func (r *rig) stopped() {
	r.t.Helper()
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	select {
	case <-r.done:
	case <-time.After(waitLimit):
		r.t.Fatal("the drain did not end")
	}
}

// tokensFree asserts that the worker holds no in-flight token of its pool.
func (r *rig) tokensFree() {
	r.t.Helper()
	require.Zero(r.t, len(r.w.pool.tokens), "in-flight tokens leaked")
	require.Zero(r.t, r.w.tokensHeld.Load(), "tokens counted as held")
}

// receiveAll receives n messages and returns them by offset.
func (r *rig) receiveAll(n int) map[int64]*message.Message {
	r.t.Helper()
	got := make(map[int64]*message.Message, n)
	for range n {
		m := r.receive()
		got[offsetOf(m)] = m
	}
	return got
}

// TestWorkerDrainTakesBackARecordBeingSent: an ack that releases the
// next record of its key hands it out with its token; when nobody receives
// it before the drain, the record is taken back unfinished (never marked),
// its token is freed, and the message still unanswered is abandoned with
// its context cancelled.
func TestWorkerDrainTakesBackARecordBeingSent(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 2, config: func(c *Config) {
		c.CompletedTail = false
		c.Ordering = ByKey
	}})
	r.send("a", "b", "a")
	got := r.receiveAll(2)
	waitUntil(t, "record 2 waits for its key", func() bool { return r.w.Stats().WaitingForKey == 1 })
	got[0].Ack()
	// Record 2 left the gate with 0's completion; the ack's goroutine
	// now waits on the output with it.
	waitUntil(t, "record 2 taken for hand-out", func() bool {
		st := r.w.Stats()
		return st.Counters.Completed == 1 && st.InFlight == 2
	})
	r.stopped()
	require.Equal(t, int64(1), r.marker.last().offset, "the final mark covers acked 0 only")
	require.Error(t, got[1].Context().Err())
	r.tokensFree()
	select {
	case m := <-r.out:
		t.Fatalf("offset %d handed out after the drain", offsetOf(m))
	default:
	}
}

// TestWorkerDrainResumesFetching: a partition whose fetching was paused
// is resumed by its drain: Sarama keeps the pause across reassignment.
func TestWorkerDrainResumesFetching(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 1})
	r.sendN(2*minResumeBelow + 3)
	waitUntil(t, "fetching paused", func() bool { p, _, _ := r.pauser.state(); return p })
	r.stopped()
	paused, _, resumes := r.pauser.state()
	require.False(t, paused)
	require.Equal(t, 1, resumes)
}

// TestWorkerNackDuringDrainIsNotRedelivered: a nack waiting out its
// NackResendSleep when the assignment ends is not redelivered, does not
// hold the drain for the sleep, and leaves the record unmarked.
func TestWorkerNackDuringDrainIsNotRedelivered(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 2, config: func(c *Config) {
		c.NackResendSleep = time.Hour
		c.DrainTimeout = time.Hour
	}})
	r.sendN(2)
	got := r.receiveAll(2)
	got[0].Nack()
	got[1].Ack()
	waitUntil(t, "the nack is taken", func() bool { return r.w.Stats().Counters.Redeliveries == 1 })
	r.stopped()
	require.LessOrEqual(t, r.marker.last().offset, int64(0), "marked past nacked record 0")
	r.tokensFree()
}

// TestWorkerDeferralFailingDuringDrain: the drain waits for a deferred
// record; a Deferral that fails meanwhile ends the wait without a
// redelivery, and the record stays unmarked.
func TestWorkerDeferralFailingDuringDrain(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 2, config: func(c *Config) {
		c.CompletedTail = false
		c.DrainTimeout = time.Hour
	}})
	r.sendN(2)
	got := r.receiveAll(2)
	rec, _ := FromContext(got[0].Context())
	d, ok := rec.Defer(got[0], nil)
	require.True(t, ok)
	got[0].Ack()
	got[1].Ack()
	close(r.stop)
	waitUntil(t, "the drain began", rec.AssignmentEnded)
	d.Resolve(errors.New("write failed"))
	r.stopped()
	require.LessOrEqual(t, r.marker.last().offset, int64(0), "marked past failed deferred record 0")
	r.tokensFree()
	select {
	case m := <-r.out:
		t.Fatalf("offset %d handed out after the drain", offsetOf(m))
	default:
	}
}

// TestWorkerKeylessNackKeepsPartitionOrder: under ByKey, a nacked
// key-less record is redelivered before the key-less record behind it,
// which never runs beside it; keyed records pass both.
func TestWorkerKeylessNackKeepsPartitionOrder(t *testing.T) {
	r := newRig(t, rigOptions{maxInFlight: 10, config: func(c *Config) { c.Ordering = ByKey }})
	r.send("", "", "a")
	got := r.receiveAll(2)
	require.Contains(t, got, int64(0))
	require.Contains(t, got, int64(2))
	got[0].Nack()
	again := r.receive()
	require.Equal(t, int64(0), offsetOf(again), "key-less record 1 ran before the redelivery of 0")
	r.quiet(30 * time.Millisecond)
	again.Ack()
	require.Equal(t, int64(1), offsetOf(r.receive()))
}

// TestWorkerOffsetsWithHoles: records at offsets with holes between them
// complete out of order; the mark never passes an unacked one, reaches the
// position after the last, and the tail a next owner reads skips exactly
// the completed ones.
func TestWorkerOffsetsWithHoles(t *testing.T) {
	tailOn := func(c *Config) { c.CompletedTail, c.TailBudget = true, frontier.DefaultMetadataBudget }
	r := newRig(t, rigOptions{maxInFlight: 10, config: tailOn, start: Start{Offset: 3, Resolved: true}})
	r.sendAt(3, 7, 8, 20, 41)
	got := r.receiveAll(5)
	got[41].Ack()
	got[8].Ack()
	got[3].Ack()
	waitUntil(t, "three completions", func() bool { return r.w.Stats().Counters.Completed == 3 })
	r.w.MarkTail()
	mk := r.marker.last()
	require.Equal(t, int64(4), mk.offset, "the prefix ends after 3, before unacked 7")
	tail, err := frontier.DecodeTail(mk.meta, 4)
	require.NoError(t, err)
	require.False(t, tail.Contains(7) || tail.Contains(20), "an unacked record is in the tail")
	require.True(t, tail.Contains(8) && tail.Contains(41))

	next := newRig(t, rigOptions{maxInFlight: 10, config: tailOn, start: Start{Offset: 4, Resolved: true},
		beforeRun: func(w *Worker) { w.StartFromCommit(4, mk.meta) }})
	next.sendAt(7, 8, 20, 41, 42)
	handed := next.receiveAll(3)
	require.Equal(t, []int64{7, 20, 42}, slices.Sorted(maps.Keys(handed)))
	next.quiet(30 * time.Millisecond)
	for _, m := range handed {
		m.Ack()
	}
	waitUntil(t, "the mark reaches the position after 42", func() bool { return next.marker.last().offset == 43 })

	got[20].Ack()
	got[7].Ack()
	waitUntil(t, "the first owner's mark reaches 42", func() bool { return r.marker.last().offset == 42 })
}

// TestWorkerPendingBound: with a slow head, no more records are retained
// than MaxPending: the next record is not taken until the head completes.
func TestWorkerPendingBound(t *testing.T) {
	const bound = 4
	r := newRig(t, rigOptions{maxInFlight: 10, config: func(c *Config) { c.MaxPending = bound }})
	r.sendN(10)
	got := r.receiveAll(bound)
	for off := int64(1); off < bound; off++ {
		got[off].Ack()
	}
	r.quiet(30 * time.Millisecond)
	st := r.w.Stats()
	require.Equal(t, bound, st.Retained)
	require.Equal(t, int64(bound), st.Delivered, "a record was taken past the bound")
	got[0].Ack()
	for range 10 - bound {
		m := r.receive()
		require.LessOrEqual(t, r.w.Stats().Retained, bound)
		m.Ack()
	}
	waitUntil(t, "everything marked", func() bool { return r.marker.last().offset == 10 })
}

// TestWorkerIgnoresUntrustedMetadata: metadata that is corrupt, relative
// to another offset, or read with a commit above the start Sarama resolved
// itself is counted, ignored, and every record is delivered.
func TestWorkerIgnoresUntrustedMetadata(t *testing.T) {
	otherBase, _, err := frontier.EncodeTail(5, []frontier.Range{{From: 6, To: 8}}, frontier.DefaultMetadataBudget)
	require.NoError(t, err)
	ownBase, _, err := frontier.EncodeTail(0, []frontier.Range{{From: 1, To: 3}}, frontier.DefaultMetadataBudget)
	require.NoError(t, err)
	for _, tc := range []struct {
		name      string
		start     Start
		committed int64
		meta      string
	}{
		{"corrupt", Start{Offset: 0, Resolved: true}, 0, ownBase[:len(ownBase)-1] + "!"},
		{"truncated", Start{Offset: 0, Resolved: true}, 0, ownBase[:len(ownBase)-2]},
		{"another base", Start{Offset: 0, Resolved: true}, 0, otherBase},
		{"committed elsewhere", Start{Offset: 0, Resolved: true}, 5, ownBase},
		// Sarama fell back from a commit above the high-water mark (5):
		// its tail lists offsets the log has not reached yet.
		{"committed above the start Sarama resolved", Start{Offset: 0}, 5, otherBase},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOptions{maxInFlight: 10, start: tc.start,
				config:    func(c *Config) { c.CompletedTail, c.TailBudget = true, frontier.DefaultMetadataBudget },
				beforeRun: func(w *Worker) { w.StartFromCommit(tc.committed, tc.meta) }})
			r.sendN(4)
			got := r.receiveAll(4)
			require.Len(t, got, 4)
			require.Equal(t, uint64(1), r.w.Stats().Counters.IgnoredMetadata)
			require.Zero(t, r.w.Stats().Counters.SkippedTail)
		})
	}
}

// TestWorkerTruncatedTail: a tail over its budget is cut; what the commit
// carries fits, and a next owner skips only what it covers: every record
// past its bound is delivered again.
func TestWorkerTruncatedTail(t *testing.T) {
	const budget = 16
	tailOn := func(c *Config) { c.CompletedTail, c.TailBudget = true, budget }
	r := newRig(t, rigOptions{maxInFlight: 100, config: tailOn, start: Start{Offset: 0, Resolved: true}})
	const n = 100
	r.sendN(n)
	got := r.receiveAll(n)
	for off := int64(1); off < n; off += 2 { // every odd record: one range each
		got[off].Ack()
	}
	waitUntil(t, "the odd records complete", func() bool { return r.w.Stats().Counters.Completed == n/2 })
	r.w.MarkTail()
	mk := r.marker.last()
	require.Equal(t, int64(0), mk.offset)
	require.LessOrEqual(t, len(mk.meta), budget)
	st := r.w.Stats()
	require.True(t, st.TailTruncated)
	require.Equal(t, len(mk.meta), st.TailBytes)
	tail, err := frontier.DecodeTail(mk.meta, 0)
	require.NoError(t, err)
	require.Less(t, tail.Bound, int64(n))

	next := newRig(t, rigOptions{maxInFlight: 100, config: tailOn, start: Start{Offset: 0, Resolved: true},
		beforeRun: func(w *Worker) { w.StartFromCommit(0, mk.meta) }})
	next.sendN(n)
	var want []int64
	for off := range int64(n) {
		if off%2 == 0 || off >= tail.Bound {
			want = append(want, off)
		}
		require.Equal(t, off%2 == 1 && off < tail.Bound, tail.Contains(off))
	}
	handed := next.receiveAll(len(want))
	require.Equal(t, want, slices.Sorted(maps.Keys(handed)))
	next.quiet(30 * time.Millisecond)
}

// TestWorkerPausesAtTailUsage: with PauseAtTailUsage, a tail near its
// budget behind unfinished records stops the partition taking records,
// and it resumes once they complete.
func TestWorkerPausesAtTailUsage(t *testing.T) {
	const budget, n = 32, 400
	r := newRig(t, rigOptions{maxInFlight: n, config: func(c *Config) {
		c.CompletedTail, c.TailBudget, c.PauseAtTailUsage = true, budget, 0.5
	}})
	r.sendN(n)
	// Hold every third record, ack the others, until nothing more comes.
	var held []*message.Message
	take := func() {
		for {
			select {
			case m := <-r.out:
				if offsetOf(m)%3 == 0 {
					held = append(held, m)
				} else {
					m.Ack()
				}
			case <-time.After(50 * time.Millisecond):
				return
			}
		}
	}
	take()
	st := r.w.Stats()
	require.True(t, st.Paused, "not paused after taking up to %d", st.Delivered)
	require.Less(t, st.Delivered, int64(n))
	require.True(t, st.TailTruncated || st.TailBytes >= budget/2, "paused with a tail of %d bytes", st.TailBytes)
	for _, m := range held {
		m.Ack()
	}
	held = nil
	waitUntil(t, "every record taken", func() bool {
		take()
		for _, m := range held {
			m.Ack()
		}
		held = nil
		return r.marker.last().offset == n
	})
	require.False(t, r.w.Stats().Paused, "paused with every record complete")
	require.Positive(t, r.w.Stats().Counters.PausedFor)
}

// TestWorkerEndsWhileConfirmingStart: a claim revoked (closed), or stop
// closed, while the worker waits for the coordinator to hold its start
// ends the worker with nothing handed out: a cooperative revocation must
// not wait for a commit that may never be taken (Sarama ends the whole
// session after Rebalance.Timeout).
func TestWorkerEndsWhileConfirmingStart(t *testing.T) {
	for _, how := range []string{"claim closed", "stopped"} {
		t.Run(how, func(t *testing.T) {
			asked := make(chan int64, 100)
			r := newRig(t, rigOptions{maxInFlight: 1, start: Start{Offset: 40},
				startCommitted: func(off int64) bool {
					asked <- off
					return false
				}})
			r.next = 42
			r.sendN(2)
			select {
			case <-asked:
			case <-time.After(waitLimit):
				t.Fatal("the start was never read back")
			}
			if how == "claim closed" {
				close(r.claim)
			} else {
				close(r.stop)
			}
			select {
			case <-r.done:
			case <-time.After(waitLimit):
				t.Fatal("the worker kept confirming its start")
			}
			r.quiet(10 * time.Millisecond)
			r.tokensFree()
		})
	}
}

// TestWorkerReadsClaimWhileConfirmingStart: the claim is read while the
// start is confirmed; the records read are kept, and handed out in order
// once the coordinator holds the start.
func TestWorkerReadsClaimWhileConfirmingStart(t *testing.T) {
	asked := make(chan struct{}, 100)
	var held atomic.Bool
	r := newRig(t, rigOptions{maxInFlight: 1, start: Start{Offset: 40},
		config: func(c *Config) { c.Ordering = ByPartition },
		startCommitted: func(int64) bool {
			asked <- struct{}{}
			return held.Load()
		}})
	r.next = 42
	r.sendN(1)
	select {
	case <-asked:
	case <-time.After(waitLimit):
		t.Fatal("the start was never read back")
	}
	r.sendN(3)
	waitUntil(t, "the claim read while the start is confirmed", func() bool { return len(r.claim) == 0 })
	held.Store(true)
	for want := int64(42); want < 46; want++ {
		m := r.receive()
		require.Equal(t, want, offsetOf(m))
		m.Ack()
	}
	waitUntil(t, "marked past every record", func() bool { return r.marker.last().offset == 46 })
}

// TestWorkerRequestsCommitOnceAllDone: a commit is asked for when every
// record taken is complete and none waits, not while one is unfinished.
func TestWorkerRequestsCommitOnceAllDone(t *testing.T) {
	var asked atomic.Int32
	r := newRig(t, rigOptions{maxInFlight: 3, start: Start{Offset: 0, Resolved: true},
		requestCommit: func() { asked.Add(1) }})
	r.sendN(3)
	got := r.receiveAll(3)
	got[0].Ack()
	got[2].Ack()
	waitUntil(t, "0 marked", func() bool { return r.marker.last().offset == 1 })
	require.Zero(t, asked.Load(), "a commit asked for with record 1 unfinished")
	got[1].Ack()
	waitUntil(t, "a commit asked for", func() bool { return asked.Load() == 1 })
	require.Equal(t, int64(3), r.marker.last().offset)
}

// TestWorkerHandsNothingOutOnceStopped: once stop closes (the subscriber
// is closing), nothing more is handed out, also before the drain begins:
// the run loop's fast paths and the goroutine that saw an ack do not
// select on stop. Before, they handed out records of an ending assignment
// (1-2 measured after Close began, under load), whose handlers then held
// the drain up.
func TestWorkerHandsNothingOutOnceStopped(t *testing.T) {
	cfg := &Config{Ordering: Unordered, Seed: maphash.MakeSeed(), Unmarshaler: kafka.DefaultMarshaler{},
		MaxPending: 100, Logger: watermill.NopLogger{}}
	out := make(chan *message.Message) // nobody reads: a hand-out would block
	pool := NewPool(out, 2)
	w, err := New(context.Background(), cfg, pool, Assignment{Topic: "t", Partition: 3, Start: Start{Offset: 0, Resolved: true}})
	require.NoError(t, err)
	stop := make(chan struct{})
	w.stop = stop
	for _, m := range records(0, 3) {
		w.accept(m)
	}
	pool.tokens <- struct{}{}
	first := w.takeReady()
	require.NotNil(t, first, "handed out before stop closed")
	first.msg.Ack()

	close(stop)
	pool.tokens <- struct{}{}
	require.Nil(t, w.takeReady(), "the run loop's hand-out after stop closed")
	pool.release()

	handedOut := make(chan *delivery, 1)
	go func() {
		handedOut <- w.completeAndContinue(first.r)
	}()
	select {
	case r := <-handedOut:
		require.Nil(t, r, "the ack's hand-out after stop closed")
	case <-time.After(10 * time.Second):
		t.Fatal("the ack's goroutine is handing a record out after stop closed")
	}
	require.Zero(t, w.Stats().InFlight)
}

// TestWorkerKeepsTailAboveMovedStart: the group committed 5 with a tail,
// and the log start then moved to 20, so Sarama fell back to
// Offsets.Initial. The first record (20) fixes the start; what the tail
// lists at or above it is skipped, the rest is delivered; the marker is
// told the real start and that part of the tail before the start is
// marked, and the start is marked with that part as its tail when tails are
// written (plain otherwise).
func TestWorkerKeepsTailAboveMovedStart(t *testing.T) {
	committed, _, err := frontier.EncodeTail(5,
		[]frontier.Range{{From: 6, To: 9}, {From: 12, To: 22}, {From: 25, To: 26}}, frontier.DefaultMetadataBudget)
	require.NoError(t, err)
	above := []frontier.Range{{From: 20, To: 22}, {From: 25, To: 26}}
	for _, write := range []bool{true, false} {
		t.Run(fmt.Sprintf("write tails=%v", write), func(t *testing.T) {
			r := newRig(t, rigOptions{maxInFlight: 10, start: Start{Offset: 20},
				config:    func(c *Config) { c.CompletedTail, c.TailBudget = write, frontier.DefaultMetadataBudget },
				beforeRun: func(w *Worker) { w.StartFromCommit(5, committed) }})
			r.next = 20
			r.sendN(8) // 20..27
			var got []int64
			for range 5 {
				got = append(got, offsetOf(r.receive()))
			}
			slices.Sort(got)
			require.Equal(t, []int64{22, 23, 24, 26, 27}, got)
			r.quiet(30 * time.Millisecond)
			st := r.w.Stats()
			require.Equal(t, uint64(3), st.Counters.SkippedTail)
			require.Zero(t, st.Counters.IgnoredMetadata)

			restarts := r.marker.restarted()
			require.Len(t, restarts, 1)
			require.Equal(t, int64(20), restarts[0].Base)
			require.Equal(t, above, restarts[0].Ranges)
			marks := r.marker.all()
			require.GreaterOrEqual(t, len(marks), 2)
			require.Equal(t, int64(20), marks[0].offset)
			require.Equal(t, marks[0].meta, marks[1].meta)
			if !write {
				require.Empty(t, marks[0].meta)
				return
			}
			tail, err := frontier.DecodeTail(marks[0].meta, 20)
			require.NoError(t, err)
			require.Equal(t, above, tail.Ranges)
		})
	}
}

// TestWorkerReadsTailWithoutWriting: a worker that writes no tail
// (CompletedTail off) still skips the records a previous owner's tail
// lists, and its marks carry no metadata.
func TestWorkerReadsTailWithoutWriting(t *testing.T) {
	meta, _, err := frontier.EncodeTail(0, []frontier.Range{{From: 2, To: 3}, {From: 4, To: 5}}, frontier.DefaultMetadataBudget)
	require.NoError(t, err)
	r := newRig(t, rigOptions{maxInFlight: 10, start: Start{Offset: 0, Resolved: true},
		beforeRun: func(w *Worker) { w.StartFromCommit(0, meta) }})
	r.sendN(6)
	var got []int64
	for range 4 {
		m := r.receive()
		got = append(got, offsetOf(m))
		m.Ack()
	}
	slices.Sort(got)
	require.Equal(t, []int64{0, 1, 3, 5}, got)
	waitUntil(t, "everything marked", func() bool { return r.marker.last().offset == 6 })
	require.Equal(t, uint64(2), r.w.Stats().Counters.SkippedTail)
	for _, mk := range r.marker.all() {
		require.Empty(t, mk.meta, "a worker that writes no tail marked metadata")
	}
}
