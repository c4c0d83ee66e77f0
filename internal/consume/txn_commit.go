package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"golang.org/x/sync/singleflight"

	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kclient"
	"github.com/safeack/safeack/internal/partition"
)

// txnCommitter is the transactional commit path of one subscription: where
// its completed offsets go instead of the group session's marks. It buffers
// the outputs of acked deliveries and the latest completed position of each
// partition, and every CommitInterval writes, in one Kafka transaction, the
// positions and exactly the outputs of the records they cover.
//
// Exactly-once needs both directions. A position never covers a record
// whose outputs are not in its transaction or an earlier one: an ack's
// outputs are added (under mu) before its ticket completes, and a position
// is recorded (under mu) only after the completions it covers. And no
// output is committed before a position covering its record is: outputs of
// records completed above a partition's unfinished head wait until the
// committed prefix or the completed tail in the metadata covers them, so a
// crash never leaves an output committed for a record its next owner
// handles again. Since the next owner skips what the committed tail lists,
// what a committed position covers must never shrink: a position whose tail
// would drop a record an earlier one covered (its encoding ran out of
// budget) waits until the prefix passes that record.
//
// Taking what a transaction covers is done under mu, so acks never wait for
// a commit: outputs acked while one is in flight land in a later one.
//
// Every consumer group session has an epoch. Positions and outputs of an
// older epoch are dropped: those of a session that ended (its last
// transaction is committed in Cleanup), and those of a session whose
// transaction aborted, whose workers are then ended so that the session
// restarts from the committed offsets and redelivers what was discarded.
// Within a session, each partition's positions and outputs belong to its
// current assignment (owners): a cooperative rebalance revokes and adds
// partitions without ending the session, and what an ended assignment
// would still record (a handler acked after the drain gave up) is dropped.
//
// Positions are committed with the session's generation and member id as
// they are when the transaction adds them: a cooperative session keeps
// its member id across rebalances, and its generation moves on with each.
type txnCommitter struct {
	pub      *Txn
	sub      *subscription
	id       string // the producer's transactional id
	interval time.Duration

	// client is the producer's connection, and answers Publish's
	// question whether an output's topic exists.
	client sarama.Client
	conns  *kclient.ConnTracker           // client's connections
	topics lockedMap[string, outputTopic] // what the cluster says of each output topic
	// lookups asks the cluster once per topic however many handlers
	// publish to it before the first answer (see outputTopic).
	lookups singleflight.Group
	// sem holds one transaction at a time, and guards producer. A
	// transaction abandoned at the shutdown deadline keeps it until the
	// producer gives up on its own (see awaitTxn).
	sem       chan struct{}
	producer  sarama.SyncProducer
	closeOnce sync.Once // closes client
	// gaveUp closes when a transaction is abandoned (see abandonTxn).
	gaveUp     chan struct{}
	gaveUpOnce sync.Once
	// cooperative: the group balances cooperatively, so a session's
	// generation moves on while its transactions run (see commit).
	cooperative bool

	mu          sync.Mutex
	epoch       uint64
	pending     map[int32][]pendingOutputs        // of acked deliveries, not yet covered by a committed position
	marks       map[int32]txnMark                 // latest position per partition since the last snapshot
	covered     map[int32]coverage                // what the group's committed position covers, per partition
	held        map[int32]kclient.CommittedOffset // the position the group holds for each current assignment: its start or last transaction
	sess        sarama.ConsumerGroupSession       // the current session: its generation and member id fence the offsets
	owners      map[int32]*txnMarker              // the marker of each partition's current assignment
	endSession  func()                            // ends the current session's assignments
	committing  bool
	ackedInTxn  uint64 // deliveries taken while committing, for TxnStats
	sessionOpen bool
	// abandoned: a transaction was given up at shutdown (see awaitTxn);
	// nothing is committed any more.
	abandoned bool
}

// txnMark is a partition's completed prefix and tail, as a worker marks it.
type txnMark struct {
	offset   int64
	metadata string
	w        *partition.Worker
	m        *txnMarker // the assignment that recorded it
}

// pendingOutputs are the outputs of one acked record.
type pendingOutputs struct {
	offset int64
	msgs   []*sarama.ProducerMessage
}

// coverage is what a committed position says is complete: every offset
// below offset, and the completed tail.
type coverage struct {
	offset int64
	tail   frontier.Tail
}

func coverageOf(offset int64, metadata string) coverage {
	tail, _ := frontier.DecodeTail(metadata, offset) // an error leaves it empty: covers less, never more
	return coverage{offset: offset, tail: tail}
}

func (c coverage) covers(offset int64) bool {
	return offset < c.offset || c.tail.Contains(offset)
}

// within reports whether next covers everything c does.
func (c coverage) within(next coverage) bool {
	if next.offset < c.offset {
		return false
	}
	for _, r := range c.tail.Ranges {
		from := max(r.From, next.offset)
		if from >= r.To {
			continue
		}
		if !next.coversRange(from, r.To) {
			return false
		}
	}
	return true
}

// cutAt is what c still covers once the log diverged at at (see
// txnMarker.diverge): nothing at or past it.
func (c coverage) cutAt(at int64) coverage {
	if c.offset >= at {
		return coverage{offset: at, tail: frontier.Tail{Base: at, Bound: at}}
	}
	t := c.tail
	kept, _ := cutRanges(t.Ranges, at)
	return coverage{offset: c.offset, tail: frontier.Tail{Base: t.Base, Bound: min(t.Bound, at), Ranges: kept}}
}

// coversRange reports whether the tail covers [from, to) whole (ranges are
// maximal, so one of them must).
func (c coverage) coversRange(from, to int64) bool {
	t := c.tail
	if to > t.Bound {
		return false
	}
	for _, r := range t.Ranges {
		if r.To > from {
			return r.From <= from && r.To >= to
		}
	}
	return false
}

func newTxnCommitter(pub *Txn, sub *subscription) (*txnCommitter, error) {
	c := &txnCommitter{
		pub:         pub,
		sub:         sub,
		id:          pub.TransactionalID + "-" + sub.topic,
		interval:    pub.CommitInterval,
		cooperative: usesCooperative(sub.cfg.OverwriteSaramaConfig),
		sem:         make(chan struct{}, 1),
		gaveUp:      make(chan struct{}),
	}
	cfg := *pub.pcfg
	cfg.Producer.Transaction.ID = c.id
	c.conns = kclient.TrackConns(&cfg)
	client, err := sarama.NewClient(pub.Brokers, &cfg)
	if err != nil {
		return nil, fmt.Errorf("safeack: connecting the transactional producer %q: %w", c.id, err)
	}
	c.client = client
	// The producer is made now so that a cluster without transactions
	// (or an id another instance holds) is an error of Subscribe.
	if err := c.ensureProducer(); err != nil {
		_ = client.Close()
		return nil, err
	}
	return c, nil
}

// checkTopic fails for an output topic the cluster does not have (nor
// creates on a metadata request), or the producer may not write to, and
// returns what the cluster says of it otherwise. Without it, such an
// output would fail every transaction it is in: the record is handled
// again after each abort, writes the same output, and the subscription
// never commits again.
func (c *txnCommitter) checkTopic(topic string) (outputTopic, error) {
	if _, err := c.client.Partitions(topic); err != nil {
		return outputTopic{}, fmt.Errorf("safeack: output topic %q: %w", topic, err)
	}
	ot := c.outputTopic(topic)
	return ot, ot.notWritable
}

// ensureProducer makes the transactional producer if there is none.
// InitProducerId, which it sends, fences and aborts what an earlier
// producer of the same id left open. Callers hold sem (or own c).
func (c *txnCommitter) ensureProducer() error {
	if c.producer != nil {
		return nil
	}
	p, err := sarama.NewSyncProducerFromClient(c.client)
	if err != nil {
		return fmt.Errorf("safeack: creating transactional producer %q: %w", c.id, err)
	}
	c.producer = p
	return nil
}

// close closes the producer; the subscription has ended. A transaction
// abandoned at the shutdown deadline is not waited for: its producer is
// closed once Sarama gives up on it.
func (c *txnCommitter) close() {
	if c.acquire() {
		c.closeProducer()
		c.release()
	}
	if c.sub.halt.isAbandoned() || c.isGivenUp() {
		go c.closeClient()
	} else {
		c.closeClient()
	}
	c.pub.releaseTopic(c.sub.topic)
}

// acquire takes sem; it reports false, without it, once a transaction
// was abandoned or the shutdown deadline passed while one held it.
func (c *txnCommitter) acquire() bool {
	select {
	case c.sem <- struct{}{}:
		return true
	default:
	}
	select {
	case c.sem <- struct{}{}:
		return true
	case <-c.gaveUp:
		return false
	case <-c.sub.halt.abandoned:
		return false
	}
}

func (c *txnCommitter) isGivenUp() bool {
	select {
	case <-c.gaveUp:
		return true
	default:
		return false
	}
}

func (c *txnCommitter) release() { <-c.sem }

// closeProducer closes the producer. Callers hold sem.
func (c *txnCommitter) closeProducer() {
	if c.producer != nil {
		if err := c.producer.Close(); err != nil {
			c.sub.logger.Debug("Closing the transactional producer", c.sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		}
		c.producer = nil
	}
}

func (c *txnCommitter) closeClient() {
	c.closeOnce.Do(func() {
		if err := c.client.Close(); err != nil && !errors.Is(err, sarama.ErrClosedClient) {
			c.sub.logger.Debug("Closing the transactional producer's client", c.sub.logFields.Add(watermill.LogFields{"err": err.Error()}))
		}
	})
}

// beginSession starts an epoch for a consumer group session: positions are
// committed with its generation and member id, which is what fences them
// once a rebalance has moved their partitions on (KIP-447). committed is
// what the group had committed when the session started; end ends the
// session's assignments.
func (c *txnCommitter) beginSession(sess sarama.ConsumerGroupSession, committed map[int32]kclient.CommittedOffset, end func()) {
	covered := make(map[int32]coverage, len(committed))
	held := make(map[int32]kclient.CommittedOffset, len(committed))
	for p, co := range committed {
		covered[p] = coverageOf(co.Offset, co.Metadata)
		held[p] = co
	}
	c.mu.Lock()
	c.epoch++
	c.resetLocked()
	c.covered, c.held = covered, held
	c.sess, c.endSession, c.sessionOpen = sess, end, true
	c.mu.Unlock()
}

// groupMetadataLocked is what fences the offsets of a transaction: the session's
// generation and member id now. Callers hold mu.
func (c *txnCommitter) groupMetadataLocked() *sarama.ConsumerGroupMetadata {
	md := &sarama.ConsumerGroupMetadata{
		GroupID:      c.sub.cfg.ConsumerGroup,
		GenerationID: c.sess.GenerationID(),
		MemberID:     c.sess.MemberID(),
	}
	if id := c.sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId; id != "" {
		md.GroupInstanceID = &id
	}
	return md
}

// resetLocked drops what the epoch buffered. Callers hold mu.
func (c *txnCommitter) resetLocked() {
	c.pending, c.marks, c.covered = make(map[int32][]pendingOutputs), make(map[int32]txnMark), make(map[int32]coverage)
	c.held = make(map[int32]kclient.CommittedOffset)
	c.owners = make(map[int32]*txnMarker)
}

// finishSession commits what the session's drained partitions completed and
// closes the epoch: acks of handlers that outlived the drain are dropped,
// and their records are the next owner's.
func (c *txnCommitter) finishSession() {
	c.commit()
	c.mu.Lock()
	// Every claim returned, and released its assignment, before Cleanup:
	// one still owned is reported ended here.
	held, notHeld := c.endAssignmentsLocked(nil)
	c.epoch++
	c.resetLocked()
	c.sess, c.endSession, c.sessionOpen = nil, nil, false
	c.mu.Unlock()
	c.sub.observeFinal(time.Now(), 0, true, held, notHeld, nil)
}

// endAssignmentsLocked returns the final positions of the current
// assignments, which end (see finalLocked). Callers hold mu.
func (c *txnCommitter) endAssignmentsLocked(failed map[int32]txnMark) (held, notHeld map[int32]kclient.CommittedOffset) {
	held, notHeld = make(map[int32]kclient.CommittedOffset), make(map[int32]kclient.CommittedOffset)
	for p := range c.owners {
		c.finalLocked(p, failed, held, notHeld)
	}
	return held, notHeld
}

// finalLocked adds the final position of partition p's assignment, which
// ends, to held or notHeld, for observeFinal: the position of a
// transaction that failed (failed) or of a mark no transaction took yet
// is not held; otherwise the group holds the assignment's last committed
// position, or the one it started from. Callers hold mu.
func (c *txnCommitter) finalLocked(p int32, failed map[int32]txnMark, held, notHeld map[int32]kclient.CommittedOffset) {
	if mk, ok := failed[p]; ok {
		notHeld[p] = kclient.CommittedOffset{Offset: mk.offset, Metadata: mk.metadata}
	} else if mk, ok := c.marks[p]; ok {
		notHeld[p] = kclient.CommittedOffset{Offset: mk.offset, Metadata: mk.metadata}
	} else if co, ok := c.held[p]; ok && co.Offset >= 0 {
		held[p] = co
	}
}

// newMarker returns the marker of a new assignment of partition in the
// current session, which from then on owns the partition's positions and
// outputs; bind it to the worker before the worker runs.
func (c *txnCommitter) newMarker(partition int32) *txnMarker {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := &txnMarker{c: c, epoch: c.epoch, partition: partition, divergedAt: -1}
	if c.owners != nil {
		c.owners[partition] = m
	}
	return m
}

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

// reportUncommitted logs, as an Error, the positions recorded since a
// transaction was abandoned: they are not committed.
func (c *txnCommitter) reportUncommitted() {
	c.mu.Lock()
	marks := c.marks
	c.marks = make(map[int32]txnMark)
	c.mu.Unlock()
	if len(marks) == 0 {
		return
	}
	offs := make(map[int32]int64, len(marks))
	for p, mk := range marks {
		offs[p] = mk.offset
	}
	c.sub.logger.Error("Final positions not committed: a transaction was abandoned at Close; the next owner handles again the records acked after the position the group holds",
		errors.New("transactional producer abandoned"),
		c.sub.logFields.Add(watermill.LogFields{"transactional_id": c.id, "uncommitted": positions(offs), "partitions": len(offs)}))
}

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
	c.sub.observeFinal(time.Now(), 0, true, held, notHeld, nil)
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
		c.sub.observeTxn(start, took, marks, len(outputs), err)
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
	c.sub.observeFinal(time.Now(), 0, true, held, notHeld, cause)
	c.pub.count(func(s *TxnStats) { s.Aborted++ })
	c.sub.logger.Error("Transaction failed and was aborted; its partitions restart from their committed offsets", cause,
		c.sub.logFields.Add(watermill.LogFields{"transactional_id": c.id}))
	if end != nil {
		end()
	}
}

// txnSessionCommitter is the committer of a transactional subscription:
// each session is an epoch of the subscription's txnCommitter, whose
// transactions carry the session's positions with the outputs of the
// records they cover, once per commit interval and at each drain.
type txnSessionCommitter struct {
	h *groupHandler
	c *txnCommitter

	// Per session: set by begin, ended by stopLoop.
	stop chan struct{}
	done chan struct{}
}

var _ committer = (*txnSessionCommitter)(nil)

// withoutCommitted ends the session: handling a committed tail's records
// again would write their outputs twice. The next session reads the
// commits again.
func (t *txnSessionCommitter) withoutCommitted(what string, err error) error {
	return fmt.Errorf("safeack: reading %s for a transactional session: %w", what, err)
}

// begin starts the session's epoch (see txnCommitter.beginSession); a
// transaction that fails ends every assignment of the session, whose next
// one fetches from the committed offsets.
func (t *txnSessionCommitter) begin(sess sarama.ConsumerGroupSession, committed map[int32]kclient.CommittedOffset) {
	t.c.beginSession(sess, committed, t.h.workers.endAll)
	t.stop, t.done = make(chan struct{}), make(chan struct{})
	go t.commitLoop(t.stop, t.done)
}

func (t *txnSessionCommitter) stopLoop(ctx context.Context) {
	if t.stop == nil {
		return
	}
	close(t.stop)
	waitOr(ctx, t.done)
	t.stop = nil
}

// finish commits what the session's drained partitions completed and ends
// the epoch (see txnCommitter.finishSession).
func (t *txnSessionCommitter) finish(context.Context, sarama.ConsumerGroupSession) {
	t.c.finishSession()
}

// claim gives the claim a marker of its own: a new assignment of the
// partition, which owns its positions and outputs until the claim returns.
// Its drain commits the final position in a transaction (Commit).
func (t *txnSessionCommitter) claim(_ sarama.ConsumerGroupSession, p int32) claimCommits {
	m := t.c.newMarker(p)
	return claimCommits{
		marker:     m,
		deliveries: m,
		bound: func(w *partition.Worker, commit kclient.CommittedOffset, have bool) {
			m.bind(w)
			if have {
				m.startFrom(commit)
			}
		},
		release: m.release,
	}
}

// commitLoop commits the session's transaction every interval, after
// marking each partition's completed prefix and tail.
func (t *txnSessionCommitter) commitLoop(stop, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(t.c.interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			t.h.workers.markTails()
			t.c.commit()
			t.h.listHighWaterMarks()
		case <-stop:
			return
		}
	}
}

// errTxnNeedsGroup guards the path without a consumer group, which
// NewTxnSubscriber (and NewTxnPublisher) refuse.
var errTxnNeedsGroup = errors.New("safeack: transactional mode needs a consumer group")

// startTxn gives the subscription its transactional commit path.
func (sub *subscription) startTxn(pub *Txn) error {
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
