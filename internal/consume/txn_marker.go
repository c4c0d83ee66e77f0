package consume

import (
	"context"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// takeCoveredLocked). Setup read it for the session's first assignments; a
// partition a cooperative rebalance adds, or gives back, is read on its
// own, and a previous owner may have committed further since.
func (m *txnMarker) startFrom(co kclient.CommittedOffset) {
	c := m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.liveLocked() {
		c.covered[m.partition] = coverageOf(co.Offset, co.Metadata)
		c.held[m.partition] = co
	}
}

// release ends the marker's assignment, after its drain committed its final
// position: what is left of it (outputs of handlers acked after the drain
// gave up, whose records are the next owner's) is dropped, and whatever it
// would still record is too. The session may go on (a cooperative
// revocation) and take the partition back later, with a new assignment that
// starts from the group's commit. An Observer is told of the
// assignment's final position (see finalLocked).
func (m *txnMarker) release() {
	c := m.c
	c.mu.Lock()
	if !m.liveLocked() {
		c.mu.Unlock()
		return
	}
	p := m.partition
	held, notHeld := make(map[int32]kclient.CommittedOffset, 1), make(map[int32]kclient.CommittedOffset, 1)
	c.finalLocked(p, nil, held, notHeld)
	delete(c.owners, p)
	delete(c.marks, p)
	delete(c.pending, p)
	delete(c.covered, p)
	delete(c.held, p)
	c.mu.Unlock()
	c.sub.commits.final(time.Now(), 0, true, held, notHeld, nil)
}

// txnMarker is the partition.Marker of a partition in transactional mode:
// marks are recorded for the next transaction, and Commit commits one now.
// As the worker's partition.DeliveryHooks, it buffers each delivery's
// outputs and moves those of acked deliveries into the next transaction.
type txnMarker struct {
	c         *txnCommitter
	epoch     uint64
	partition int32
	w         *partition.Worker
	// divergedAt is where the partition's log diverged while the
	// assignment consumed it (see diverge); -1: it did not. Guarded by
	// c.mu.
	divergedAt int64
}

// liveLocked reports whether the marker's assignment is current: its
// session's epoch, and not ended. Callers hold c.mu.
func (m *txnMarker) liveLocked() bool {
	return m.epoch == m.c.epoch && m.c.owners[m.partition] == m
}

var (
	_ partition.Marker        = (*txnMarker)(nil)
	_ partition.Restarter     = (*txnMarker)(nil)
	_ partition.DeliveryHooks = (*txnMarker)(nil)
	_ divergenceTaker         = (*txnMarker)(nil)
)

func (m *txnMarker) bind(w *partition.Worker) { m.w = w }

// MarkOffset records the partition's completed position for the next
// transaction. The worker marks only forward (see markIfAdvanced), so the
// latest mark is the one to commit.
func (m *txnMarker) MarkOffset(_ string, partition int32, offset int64, metadata string) {
	m.record(partition, offset, metadata)
}

// ResetOffset records a new tail at an unchanged offset, as MarkOffset.
func (m *txnMarker) ResetOffset(_ string, partition int32, offset int64, metadata string) {
	m.record(partition, offset, metadata)
}

// Commit commits a transaction now: a drained partition's last position
// must be committed before the partition is handed on.
func (m *txnMarker) Commit() { m.c.commit() }

// diverge takes a truncation of the partition's log found while the
// assignment consumes it (see epochWatch), before the watch marks the
// position held at the divergence point: what the group's commit covers
// at or past at names records the log no longer holds, and the new
// leader's records there have no output yet. Kept, that coverage would
// refuse the held position (it covers less: see takeCoveredLocked), and
// the group would keep a position past records never handled. A
// transaction in flight that commits a position past at is cut the same
// way once it is done (see commit). The mark no transaction took yet,
// recorded before the divergence was known, is dropped (the watch marks
// it again, held), and so are the outputs of records at or past at: no
// position of the assignment covers them any more, and the records they
// came from are gone.
func (m *txnMarker) diverge(at int64) {
	c := m.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !m.liveLocked() {
		return
	}
	p := m.partition
	m.divergedAt = at
	if cov, ok := c.covered[p]; ok {
		c.covered[p] = cov.cutAt(at)
	}
	if mk, ok := c.marks[p]; ok && mk.m == m {
		delete(c.marks, p)
	}
	kept := c.pending[p][:0]
	for _, po := range c.pending[p] {
		if po.offset < at {
			kept = append(kept, po)
		}
	}
	clear(c.pending[p][len(kept):])
	c.pending[p] = kept
}

// coverageLocked is what a position of the assignment's covers, cut
// where the log diverged (see diverge). Callers hold c.mu.
func (m *txnMarker) coverageLocked(cov coverage) coverage {
	if m.divergedAt < 0 {
		return cov
	}
	return cov.cutAt(m.divergedAt)
}

// Restart replaces what the session took the group's commit to cover for
// partition: Sarama found that commit out of range and fetches from start
// (see partition.Restarter). Kept as it was, a commit above the high-water
// mark would refuse every position below it, so that nothing is committed
// and no output written; the part of a tail below start lists records that
// are gone. What the tail lists at or above start stays covered: those
// records' outputs are written, and a position that dropped them would
// have them handled again.
func (m *txnMarker) Restart(partition int32, start int64, tail frontier.Tail) {
	c := m.c
	c.mu.Lock()
	if m.epoch != c.epoch {
		c.mu.Unlock()
		m.stale()
		return
	}
	c.covered[partition] = coverage{offset: start, tail: tail}
	c.mu.Unlock()
}

func (m *txnMarker) record(partition int32, offset int64, metadata string) {
	c := m.c
	c.mu.Lock()
	if !m.liveLocked() || partition != m.partition {
		c.mu.Unlock()
		m.stale()
		return
	}
	c.marks[partition] = txnMark{offset: offset, metadata: metadata, w: m.w, m: m}
	c.mu.Unlock()
}

// stale ends the assignment of a worker whose epoch is over: its positions
// and outputs are no longer committed, so it must not go on handling
// records (a session whose transaction aborted restarts from the committed
// offsets once its assignments end).
func (m *txnMarker) stale() {
	if m.w != nil {
		m.w.End()
	}
}

// Started gives delivery msg its output buffer, in its context, where
// Publish finds it through the outputs' contexts (derived from msg's). The
// worker hands the buffer back to Acked and Nacked: msg's own context may
// have been replaced by then.
func (m *txnMarker) Started(ctx context.Context, msg *message.Message) (context.Context, any) {
	d := &TxnDelivery{committer: m.c, msg: msg}
	return context.WithValue(ctx, txnDeliveryKey{}, d), d
}

// Acked moves the outputs of rec's acked delivery msg into the next
// transaction. The worker calls it before the record completes.
func (m *txnMarker) Acked(rec *sarama.ConsumerMessage, _ *message.Message, state any) {
	d, ok := state.(*TxnDelivery)
	if !ok {
		return
	}
	outs := d.take()
	c := m.c
	c.mu.Lock()
	if !m.liveLocked() {
		c.mu.Unlock()
		m.stale()
		return
	}
	if len(outs) > 0 {
		p := rec.Partition
		c.pending[p] = append(c.pending[p], pendingOutputs{offset: rec.Offset, msgs: outs})
	}
	if c.committing {
		c.ackedInTxn++
	}
	c.mu.Unlock()
}

// Nacked drops the outputs of a nacked delivery.
func (m *txnMarker) Nacked(_ *message.Message, state any) {
	if d, ok := state.(*TxnDelivery); ok {
		d.take()
	}
}
