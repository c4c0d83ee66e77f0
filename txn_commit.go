package safeack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
)

// txnCommitter is the transactional commit path of one subscription: where
// its completed offsets go instead of the group session's marks. It buffers
// the outputs of acked deliveries and the latest completed position of each
// partition, and every CommitInterval writes both in one Kafka transaction.
//
// Taking what a transaction covers is a swap under mu, so acks never wait
// for a commit: outputs acked while one is in flight land in the next. The
// snapshot is consistent because an ack's outputs are added (under mu)
// before its ticket completes, and a partition's position is recorded
// (under mu) only after the completions it covers: a position in a snapshot
// never covers a record whose outputs are not in that snapshot or an
// earlier one.
//
// Every consumer group session has an epoch. Positions and outputs of an
// older epoch are dropped: those of a session that ended (its last
// transaction is committed in Cleanup), and those of a session whose
// transaction aborted, whose workers are then ended so that the session
// restarts from the committed offsets and redelivers what was discarded.
type txnCommitter struct {
	pub      *TxnPublisher
	sub      *subscription
	id       string // the producer's transactional id
	interval time.Duration

	commitMu sync.Mutex // one transaction at a time; guards producer
	producer sarama.SyncProducer

	mu          sync.Mutex
	epoch       uint64
	outputs     []*sarama.ProducerMessage // of deliveries acked since the last snapshot
	marks       map[int32]txnMark         // latest position per partition since the last snapshot
	group       *sarama.ConsumerGroupMetadata
	endSession  func() // ends the current session's assignments
	committing  bool
	ackedInTxn  uint64 // deliveries taken while committing, for TxnStats
	sessionOpen bool
}

// txnMark is a partition's completed prefix and tail, as a worker marks it.
type txnMark struct {
	offset   int64
	metadata string
	w        *partitionWorker
}

func newTxnCommitter(pub *TxnPublisher, sub *subscription) (*txnCommitter, error) {
	c := &txnCommitter{
		pub:      pub,
		sub:      sub,
		id:       pub.cfg.TransactionalID + "-" + sub.topic,
		interval: pub.cfg.CommitInterval,
		marks:    make(map[int32]txnMark),
	}
	// The producer is made now so that a cluster without transactions
	// (or an id another instance holds) is an error of Subscribe.
	if err := c.ensureProducer(); err != nil {
		return nil, err
	}
	return c, nil
}

// ensureProducer makes the transactional producer if there is none.
// InitProducerId, which it sends, fences and aborts what an earlier
// producer of the same id left open. Callers hold commitMu (or own c).
func (c *txnCommitter) ensureProducer() error {
	if c.producer != nil {
		return nil
	}
	cfg := *c.pub.pcfg
	cfg.Producer.Transaction.ID = c.id
	p, err := sarama.NewSyncProducer(c.pub.cfg.Brokers, &cfg)
	if err != nil {
		return fmt.Errorf("safeack: creating transactional producer %q: %w", c.id, err)
	}
	c.producer = p
	return nil
}

// close closes the producer; the subscription has ended.
func (c *txnCommitter) close() {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	if c.producer != nil {
		if err := c.producer.Close(); err != nil {
			c.sub.logger.Debug("Closing the transactional producer", c.sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		}
		c.producer = nil
	}
	c.pub.releaseTopic(c.sub.topic)
}

// beginSession starts an epoch for a consumer group session: positions are
// committed with its generation and member id, which is what fences them
// once a rebalance has moved their partitions on (KIP-447). end ends the
// session's assignments.
func (c *txnCommitter) beginSession(sess sarama.ConsumerGroupSession, end func()) {
	md := &sarama.ConsumerGroupMetadata{
		GroupID:      c.sub.cfg.ConsumerGroup,
		GenerationID: sess.GenerationID(),
		MemberID:     sess.MemberID(),
	}
	if id := c.sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId; id != "" {
		md.GroupInstanceID = &id
	}
	c.mu.Lock()
	c.epoch++
	c.outputs, c.marks = nil, make(map[int32]txnMark)
	c.group, c.endSession, c.sessionOpen = md, end, true
	c.mu.Unlock()
}

// finishSession commits what the session's drained partitions completed and
// closes the epoch: acks of handlers that outlived the drain are dropped,
// and their records are the next owner's.
func (c *txnCommitter) finishSession() {
	c.commit()
	c.mu.Lock()
	c.epoch++
	c.outputs, c.marks = nil, make(map[int32]txnMark)
	c.group, c.endSession, c.sessionOpen = nil, nil, false
	c.mu.Unlock()
}

// newMarker returns the marker of a partition worker of the current
// session; bind it to the worker before the worker runs.
func (c *txnCommitter) newMarker() *txnMarker {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &txnMarker{c: c, epoch: c.epoch}
}

// txnMarker is the offsetMarker of a partition in transactional mode: marks
// are recorded for the next transaction, and Commit commits one now.
type txnMarker struct {
	c     *txnCommitter
	epoch uint64
	w     *partitionWorker
}

func (m *txnMarker) bind(w *partitionWorker) { m.w = w }

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

func (m *txnMarker) record(partition int32, offset int64, metadata string) {
	c := m.c
	c.mu.Lock()
	if m.epoch != c.epoch {
		c.mu.Unlock()
		m.stale()
		return
	}
	c.marks[partition] = txnMark{offset: offset, metadata: metadata, w: m.w}
	c.mu.Unlock()
}

// stale ends the assignment of a worker whose epoch is over: its positions
// and outputs are no longer committed, so it must not go on handling
// records (a session whose transaction aborted restarts from the committed
// offsets once its assignments end).
func (m *txnMarker) stale() {
	if m.w != nil {
		m.w.cancel()
	}
}

// newDelivery gives a delivery of r its output buffer, in the delivery's
// context and in r (read back when the delivery is answered).
func (m *txnMarker) newDelivery(ctx context.Context, r *record) context.Context {
	d := &txnDelivery{committer: m.c, msg: r.wm}
	r.txnCur = d
	return context.WithValue(ctx, txnDeliveryKey{}, d)
}

// acked moves the outputs of r's acked delivery into the next transaction.
// Call it before the ticket completes.
func (m *txnMarker) acked(r *record) {
	d := r.txnCur
	if d == nil {
		return
	}
	outs := d.take()
	c := m.c
	c.mu.Lock()
	if m.epoch != c.epoch {
		c.mu.Unlock()
		m.stale()
		return
	}
	c.outputs = append(c.outputs, outs...)
	if c.committing {
		c.ackedInTxn++
	}
	c.mu.Unlock()
}

// nacked drops the outputs of r's nacked delivery.
func (m *txnMarker) nacked(r *record) {
	if d := r.txnCur; d != nil {
		d.take()
	}
}

// commit writes the outputs and positions recorded since the last commit
// in one transaction. On failure the transaction is aborted, the epoch is
// closed and the session ended, so that its partitions restart from their
// committed offsets.
func (c *txnCommitter) commit() {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	c.mu.Lock()
	if !c.sessionOpen {
		c.mu.Unlock()
		return
	}
	outputs, marks, group, epoch := c.outputs, c.marks, c.group, c.epoch
	if len(outputs) == 0 && len(marks) == 0 {
		c.mu.Unlock()
		return
	}
	c.outputs, c.marks = nil, make(map[int32]txnMark, len(marks))
	c.committing = true
	c.mu.Unlock()

	start := time.Now()
	err := c.runTxn(outputs, marks, group)
	took := time.Since(start)

	c.mu.Lock()
	c.committing = false
	during := c.ackedInTxn
	c.ackedInTxn = 0
	c.mu.Unlock()

	if err != nil {
		c.abort(epoch, err)
		return
	}
	for p, mk := range marks {
		if mk.w != nil && mk.w.partition == p {
			mk.w.setConfirmed(mk.offset)
		}
	}
	c.pub.count(func(s *TxnStats) {
		s.Committed++
		s.Outputs += uint64(len(outputs))
		s.AckedDuringCommit += during
		s.CommitTime += took
		s.MaxCommit = max(s.MaxCommit, took)
	})
}

// runTxn writes one transaction. Callers hold commitMu.
func (c *txnCommitter) runTxn(outputs []*sarama.ProducerMessage, marks map[int32]txnMark, group *sarama.ConsumerGroupMetadata) error {
	if err := c.ensureProducer(); err != nil {
		return err
	}
	p := c.producer
	if err := p.BeginTxn(); err != nil {
		return fmt.Errorf("beginning a transaction: %w", err)
	}
	if len(outputs) > 0 {
		if err := p.SendMessages(outputs); err != nil {
			return fmt.Errorf("writing %d outputs: %w", len(outputs), err)
		}
	}
	if len(marks) > 0 {
		offsets := make([]*sarama.PartitionOffsetMetadata, 0, len(marks))
		for part, mk := range marks {
			meta := mk.metadata
			offsets = append(offsets, &sarama.PartitionOffsetMetadata{Partition: part, Offset: mk.offset, Metadata: &meta, LeaderEpoch: -1})
		}
		if err := p.AddOffsetsToTxnWithGroupMetadata(map[string][]*sarama.PartitionOffsetMetadata{c.sub.topic: offsets}, group); err != nil {
			return fmt.Errorf("adding offsets: %w", err)
		}
	}
	if err := p.CommitTxn(); err != nil {
		return fmt.Errorf("committing: %w", err)
	}
	return nil
}

// abort ends a failed transaction: aborted when the producer allows it,
// the producer replaced otherwise (its successor's InitProducerId aborts
// what it left open). The epoch's outputs and positions are dropped and the
// session ended: its partitions restart from their committed offsets, and
// the records whose outputs were discarded are handled again. Callers hold
// commitMu.
func (c *txnCommitter) abort(epoch uint64, cause error) {
	if p := c.producer; p != nil {
		st := p.TxnStatus()
		aborted := false
		if st&sarama.ProducerTxnFlagFatalError == 0 && st&(sarama.ProducerTxnFlagInTransaction|sarama.ProducerTxnFlagAbortableError) != 0 {
			aborted = p.AbortTxn() == nil
		}
		if !aborted && p.TxnStatus()&sarama.ProducerTxnFlagReady == 0 {
			_ = p.Close()
			c.producer = nil
		}
	}
	c.mu.Lock()
	var end func()
	if c.epoch == epoch {
		c.epoch++
		c.outputs, c.marks = nil, make(map[int32]txnMark)
		end = c.endSession
	}
	c.mu.Unlock()
	c.pub.count(func(s *TxnStats) { s.Aborted++ })
	c.sub.logger.Error("Transaction failed and was aborted; its partitions restart from their committed offsets", cause,
		c.sub.logFields.Add(watermill.LogFields{"transactional_id": c.id}))
	if end != nil {
		end()
	}
}

// txnCommitLoop commits the session's transaction every interval, after
// marking each partition's completed prefix and tail.
func (h *groupHandler) txnCommitLoop(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(h.txn.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			h.markTails()
			h.txn.commit()
		case <-stop:
			return
		}
	}
}

// endAssignments ends every assignment of the session: a Sarama session
// ends once one of its ConsumeClaims returns, and the next one fetches from
// the committed offsets.
func (h *groupHandler) endAssignments() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.workers {
		w.cancel()
	}
}

// errTxnNeedsGroup guards the path without a consumer group, which
// NewTxnPublisher refuses.
var errTxnNeedsGroup = errors.New("safeack: transactional mode needs a consumer group")

// startTxn gives the subscription its transactional commit path.
func (sub *subscription) startTxn(pub *TxnPublisher) error {
	if sub.cfg.ConsumerGroup == "" {
		return errTxnNeedsGroup
	}
	if err := pub.claimTopic(sub.topic); err != nil {
		return err
	}
	c, err := newTxnCommitter(pub, sub)
	if err != nil {
		pub.releaseTopic(sub.topic)
		return err
	}
	sub.txn = c
	return nil
}
