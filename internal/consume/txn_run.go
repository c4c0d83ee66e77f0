package consume

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/kclient"
)

// startFrom takes what the group has committed on the marker's partition as
// the assignment starts: what a position must keep covering (see
// awaitTxn waits for the transaction whose result done brings. Once the
// subscription stops it waits at most closeCommitWait more, and not past
// the shutdown deadline: a broker that does not answer its EndTxn would
// otherwise hold Close for Net.ReadTimeout on each of Sarama's
// Producer.Transaction.Retry.Max attempts (25 minutes at the defaults).
// It reports false when it gave up.
func (c *txnCommitter) awaitTxn(done <-chan error) (error, bool) {
	stopped := c.sub.halt.stopped
	var timeout <-chan time.Time
	for {
		select {
		case err := <-done:
			return err, true
		case <-stopped:
			stopped = nil
			t := time.NewTimer(c.sub.cfg.closeCommitWait())
			defer t.Stop()
			timeout = t.C
		case <-timeout:
			return nil, false
		case <-c.sub.halt.abandoned:
			return nil, false
		}
	}
}

// abandonTxn gives up a transaction the broker did not answer in time at
// shutdown. It is committed or aborted as a whole, whichever the broker
// does: its outputs and the positions that cover their records together.
// Left open, it is aborted by the next producer with the same
// transactional id (InitProducerId), or by the broker after
// Producer.Transaction.Timeout, and the partitions' next owner handles
// those records again. Nothing is committed after it. The producer is
// closed once Sarama gives up on it; its client is closed now, so that
// happens soon.
func (c *txnCommitter) abandonTxn(done <-chan error, marks map[int32]txnMark, outputs int, waited time.Duration) {
	c.mu.Lock()
	c.abandoned = true
	c.mu.Unlock()
	c.gaveUpOnce.Do(func() { close(c.gaveUp) })
	offs := make(map[int32]int64, len(marks))
	for p, mk := range marks {
		offs[p] = mk.offset
	}
	c.pub.count(func(s *TxnStats) { s.Abandoned++ })
	c.sub.logger.Error("Close abandoned a transaction the broker did not answer in time: it is committed or aborted as a whole; left open, the next producer with this transactional id aborts it (or the broker after Producer.Transaction.Timeout), and the next owner handles its records again",
		fmt.Errorf("no answer after %v", waited.Round(time.Millisecond)),
		c.sub.logFields.Add(watermill.LogFields{"transactional_id": c.id, "in_doubt": positions(offs), "outputs": outputs}))
	go func() {
		<-done
		c.closeProducer()
		c.release()
	}()
	// Its requests fail at once, and so the producer's retries soon.
	c.conns.Abandon()
	go c.closeClient()
}

// commit writes the outputs and positions recorded since the last commit
// in one transaction. On failure the transaction is aborted, the epoch is
// closed and the session ended, so that its partitions restart from their
// committed offsets. Once the subscription stops, a transaction is waited
// for at most closeCommitWait (see awaitTxn).
func (c *txnCommitter) commit() {
	if !c.acquire() {
		c.reportUncommitted()
		return
	}
	held := true
	defer func() {
		if held {
			c.release()
		}
	}()
	c.mu.Lock()
	if c.abandoned {
		c.mu.Unlock()
		c.reportUncommitted()
		return
	}
	if !c.sessionOpen || sessionFenced(c.sess.Context()) {
		// A fenced member's positions are not its to commit: its
		// TxnOffsetCommit would be refused, aborting the outputs anyway.
		c.mu.Unlock()
		return
	}
	if len(c.marks) == 0 {
		c.mu.Unlock()
		return // outputs wait for a position that covers them
	}
	outputs, marks, next := c.takeCoveredLocked()
	epoch := c.epoch
	c.committing = true
	c.mu.Unlock()
	if len(marks) == 0 {
		c.mu.Lock()
		c.committing = false
		c.mu.Unlock()
		return
	}

	start := time.Now()
	done := make(chan error, 1)
	go func() {
		used, err := c.runTxn(outputs, marks)
		if err != nil && c.cooperative {
			err = c.retryInNextGeneration(outputs, marks, used, err)
		}
		if err != nil {
			c.abortOpen()
		}
		done <- err
	}()
	err, answered := c.awaitTxn(done)
	took := time.Since(start)
	if answered {
		c.report(start, took, marks, len(outputs), err)
	}

	c.mu.Lock()
	c.committing = false
	during := c.ackedInTxn
	c.ackedInTxn = 0
	c.mu.Unlock()

	if !answered {
		held = false // the transaction's goroutine keeps sem (see abandonTxn)
		c.abandonTxn(done, marks, len(outputs), took)
		return
	}
	if err != nil {
		c.forgetRefusedTopics(err)
		c.abort(epoch, marks, err)
		return
	}
	c.mu.Lock()
	for p, cov := range next {
		if mk := marks[p]; mk.m != nil && mk.m.liveLocked() {
			c.covered[p] = mk.m.coverageLocked(cov) // an assignment ended meanwhile starts from the group's commit when it comes back
			c.held[p] = kclient.CommittedOffset{Offset: mk.offset, Metadata: mk.metadata}
		}
	}
	c.mu.Unlock()
	for p, mk := range marks {
		if mk.w != nil && mk.w.Partition() == p {
			mk.w.SetConfirmed(mk.offset)
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

// takeCoveredLocked takes the positions recorded since the last commit and
// the outputs of the records they cover. A position whose coverage would
// not contain what the group's committed one covers stays for a later
// commit. It returns the outputs, the positions and their coverage.
// Callers hold mu.
func (c *txnCommitter) takeCoveredLocked() ([]*sarama.ProducerMessage, map[int32]txnMark, map[int32]coverage) {
	marks := c.marks
	c.marks = make(map[int32]txnMark)
	next := make(map[int32]coverage, len(marks))
	var outputs []*sarama.ProducerMessage
	for p, mk := range marks {
		cov := coverageOf(mk.offset, mk.metadata)
		if prev, ok := c.covered[p]; ok && !prev.within(cov) {
			c.marks[p] = mk
			delete(marks, p)
			continue
		}
		next[p] = cov
		keep := c.pending[p][:0]
		for _, po := range c.pending[p] {
			if cov.covers(po.offset) {
				outputs = append(outputs, po.msgs...)
			} else {
				keep = append(keep, po)
			}
		}
		clear(c.pending[p][len(keep):])
		c.pending[p] = keep
	}
	return outputs, marks, next
}

// runTxn writes one transaction, and returns the group metadata its
// offsets were committed with: the session's generation and member id as
// they are once the outputs are written, just before the offsets go to the
// coordinator (at CommitTxn). Callers hold sem.
func (c *txnCommitter) runTxn(outputs []*sarama.ProducerMessage, marks map[int32]txnMark) (*sarama.ConsumerGroupMetadata, error) {
	return c.runTxnAs(outputs, marks, nil)
}

// runTxnAs is runTxn with the offsets committed as group, or as the
// session is now when group is nil.
func (c *txnCommitter) runTxnAs(outputs []*sarama.ProducerMessage, marks map[int32]txnMark, group *sarama.ConsumerGroupMetadata) (*sarama.ConsumerGroupMetadata, error) {
	if err := c.ensureProducer(); err != nil {
		return group, err
	}
	p := c.producer
	if err := p.BeginTxn(); err != nil {
		return group, fmt.Errorf("beginning a transaction: %w", err)
	}
	if len(outputs) > 0 {
		for _, round := range c.outputRounds(outputs) {
			if err := p.SendMessages(round); err != nil {
				return group, fmt.Errorf("writing %d outputs: %w", len(round), produceError(err))
			}
		}
	}
	if len(marks) > 0 {
		if group == nil {
			c.mu.Lock()
			if c.sess == nil {
				c.mu.Unlock()
				return nil, errors.New("the consumer group session ended")
			}
			group = c.groupMetadataLocked()
			c.mu.Unlock()
		}
		offsets := make([]*sarama.PartitionOffsetMetadata, 0, len(marks))
		for part, mk := range marks {
			meta := mk.metadata
			offsets = append(offsets, &sarama.PartitionOffsetMetadata{Partition: part, Offset: mk.offset, Metadata: &meta, LeaderEpoch: -1})
		}
		if err := p.AddOffsetsToTxnWithGroupMetadata(map[string][]*sarama.PartitionOffsetMetadata{c.sub.topic: offsets}, group); err != nil {
			return group, fmt.Errorf("adding offsets: %w", err)
		}
	}
	if err := p.CommitTxn(); err != nil {
		return group, fmt.Errorf("committing: %w", err)
	}
	return group, nil
}

// generationRetries bounds how often one transaction is tried again in a
// new generation (see retryInNextGeneration).
const generationRetries = 3

// retryInNextGeneration tries a transaction again, once the session's
// generation has moved on, when the coordinator refused its offsets for
// the generation they carried (ILLEGAL_GENERATION). With cooperative
// balancing the session goes on across rebalances, and the coordinator
// moves to the next generation when every member has rejoined, before
// Sarama learns the new one (at SyncGroup): a transaction committed in
// between carries the old one. The member keeps its partitions (a revoked
// one is handed on only after its claim's drain, which waits for sem,
// committed), so the same outputs and positions are committed with the
// new generation, after aborting the refused transaction. A member id that
// changed means the member was dropped from the group and its partitions
// may have moved on: the transaction stays refused (see abort).
// Callers hold sem.
func (c *txnCommitter) retryInNextGeneration(outputs []*sarama.ProducerMessage, marks map[int32]txnMark,
	used *sarama.ConsumerGroupMetadata, err error) error {
	for range generationRetries {
		if used == nil || !errors.Is(err, sarama.ErrIllegalGeneration) {
			return err
		}
		next, ok := c.awaitGeneration(used)
		if !ok {
			return err
		}
		c.abortOpen()
		c.sub.logger.Info("Transaction refused for a generation that moved on; committing it again with the new one",
			c.sub.logFields.Add(watermill.LogFields{"transactional_id": c.id, "generation": used.GenerationID, "next_generation": next.GenerationID}))
		c.pub.count(func(s *TxnStats) { s.Retried++ })
		used, err = c.runTxnAs(outputs, marks, next)
	}
	return err
}

// awaitGeneration waits, up to Rebalance.Timeout, for the session to move
// past the generation used with the same member id, and returns the group
// metadata to commit with then. It reports false when the member id
// changed, or the session ended, first.
func (c *txnCommitter) awaitGeneration(used *sarama.ConsumerGroupMetadata) (*sarama.ConsumerGroupMetadata, bool) {
	c.mu.Lock()
	sess := c.sess
	c.mu.Unlock()
	if sess == nil {
		return nil, false
	}
	deadline := time.NewTimer(c.sub.cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		// Generation first: Sarama stores the member id before it, so a
		// new generation comes with its member id.
		gen, member := sess.GenerationID(), sess.MemberID()
		if member != used.MemberID {
			return nil, false
		}
		if gen != used.GenerationID {
			next := *used
			next.GenerationID = gen
			return &next, true
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return nil, false
		case <-sess.Context().Done():
			return nil, false
		}
	}
}

// abortOpen aborts the producer's open transaction when it allows it, and
// otherwise closes the producer (its successor's InitProducerId, sent by
// ensureProducer, aborts what it left open). Callers hold sem.
func (c *txnCommitter) abortOpen() {
	p := c.producer
	if p == nil {
		return
	}
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

// abort ends a failed transaction (abortOpen has run): the epoch's
// outputs and positions are dropped and the session ended, so that its
// partitions restart from their committed offsets, and the records whose
// outputs were discarded are handled again: the session's assignments end
// here, with marks (the failed transaction's positions) not committed.
// Callers hold sem.
func (c *txnCommitter) abort(epoch uint64, marks map[int32]txnMark, cause error) {
	c.mu.Lock()
	var end func()
	var held, notHeld map[int32]kclient.CommittedOffset
	if c.epoch == epoch {
		held, notHeld = c.endAssignmentsLocked(marks)
		c.epoch++
		c.resetLocked()
		end = c.endSession
	}
	c.mu.Unlock()
	c.sub.commits.final(time.Now(), 0, true, held, notHeld, cause)
	c.pub.count(func(s *TxnStats) { s.Aborted++ })
	c.sub.logger.Error("Transaction failed and was aborted; its partitions restart from their committed offsets", cause,
		c.sub.logFields.Add(watermill.LogFields{"transactional_id": c.id}))
	if end != nil {
		end()
	}
}

// report tells the host of a transaction of the commit path.
func (c *txnCommitter) report(start time.Time, took time.Duration, marks map[int32]txnMark, outputs int, err error) {
	a := c.sub.commits
	if a == nil {
		return
	}
	ev := CommitReport{Topic: c.sub.topic, Group: a.group, Transactional: true, Outputs: outputs,
		Start: start, Duration: took, Err: err, Partitions: make([]CommittedPartition, 0, len(marks))}
	for p, mk := range marks {
		ev.Partitions = append(ev.Partitions, committedPartition(p, mk.offset, mk.metadata))
	}
	slices.SortFunc(ev.Partitions, func(x, y CommittedPartition) int { return cmp.Compare(x.Partition, y.Partition) })
	a.host.Committed(ev)
}
