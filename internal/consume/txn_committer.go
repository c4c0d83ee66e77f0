package consume

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"golang.org/x/sync/singleflight"

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
	sess        groupSession                      // the current session: its generation and member id fence the offsets
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
func (c *txnCommitter) beginSession(sess groupSession, committed map[int32]kclient.CommittedOffset, end func()) {
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
	c.sub.commits.final(time.Now(), 0, true, held, notHeld, nil)
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
// ends, to held or notHeld, for commitReports.final: the position of a
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
