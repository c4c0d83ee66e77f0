package consume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/safeack/safeack/internal/kclient"
)

// Partitions the group assigns to this member that Sarama cannot claim.
//
// Sarama (v1.61.1) starts one claim per assigned partition after Setup. A
// partition without a leader in its metadata is held back: the claim waits,
// looking at the cached metadata again every 5 seconds, which nothing
// refreshes before Metadata.RefreshFrequency (10 minutes by default). A
// claim whose start fails (ConsumePartition: the leader does not answer, or
// refuses) is retried Metadata.Retry.Max times, about a second, and then
// given up: Sarama reports the error to Errors() and ends the session,
// and the member rejoins at once, for as long as the fault lasts. And
// before it joins (Consume), and before it starts the claims a cooperative
// rebalance adds, Sarama refreshes the topic's metadata and gives up on a
// partition without a leader (LEADER_NOT_AVAILABLE, Kafka's answer while
// every replica of a partition is down): one such partition keeps the
// member out of the group, and at the group's next rebalance every member.
//
// The subscription's consumer group therefore runs on a groupClient, and
// each session's claims are followed by a claimWatch: a partition without
// a leader is assigned and waits like any other, the watch holds back the
// claims its leader could not answer for in Setup, or just before Sarama
// starts a claim a cooperative rebalance added (so that Sarama waits
// instead of failing them and ending the session), refreshes the metadata
// while a claim waits and releases a held one once its leader answers, and
// reports a claim that has not started within claimOverdueAfter: an Error
// log and Subscriber.Unclaimed.
//
// A partition that loses its leader once its claim runs is followed by the
// subscription's leaderLoss, in either mode; without a consumer group, the
// partitions that cannot start wait in noGroupConsumer.watchPartitions.

// claimPollWait is how often Sarama looks again at a claim it holds back
// (consumerGroupSession.startClaim; not configurable).
const claimPollWait = 5 * time.Second

// claimCheckEvery is how often a claimWatch looks at the session's claims;
// claimWaitGrace is how long a claim may take to start before the watch
// refreshes the metadata for it.
const (
	claimCheckEvery = time.Second
	claimWaitGrace  = time.Second
)

// errNoLeader is why a claim waits when nothing more precise is known: the
// cluster's metadata names no leader for the partition.
var errNoLeader = errors.New("the partition has no leader in the cluster metadata")

// claimOverdueAfter is how long after its assignment a claim may take to
// start before it is reported: Sarama's retries of the claim (the
// Metadata.Retry budget) and one wait of a held-back claim (claimPollWait),
// with a second to spare.
func claimOverdueAfter(conf *sarama.Config) time.Duration {
	return claimPollWait + metadataRetryBudget(conf) + time.Second
}

// metadataRetryBudget is what Sarama's waits between the attempts of a
// metadata retry loop add up to.
func metadataRetryBudget(conf *sarama.Config) time.Duration {
	var sum time.Duration
	for left := conf.Metadata.Retry.Max - 1; left >= 0; left-- {
		if f := conf.Metadata.Retry.BackoffFunc; f != nil {
			sum += f(left, conf.Metadata.Retry.Max)
		} else {
			sum += conf.Metadata.Retry.Backoff
		}
	}
	return sum
}

// claimWatch follows the claims of one subscription's group sessions (see
// the comment at the top of the file). Setup starts it (begin), each
// ConsumeClaim tells it (claimStarted, claimEnded), Cleanup stops it (end).
type claimWatch struct {
	sub    *subscription
	client sarama.Client // the subscription's: Sarama's consumer group reads its metadata
	// overdueAfter is claimOverdueAfter of the subscription's config.
	overdueAfter time.Duration

	mu    sync.Mutex
	sess  groupSession          // nil between sessions
	parts map[int32]*claimState // the session's assignment
	stop  chan struct{}         // closed by end
	// failures counts the sessions in a row that ended because Sarama gave
	// a claim up (see rejoinDelay).
	failures int
}

// claimState is what a claimWatch knows of one assigned partition.
type claimState struct {
	since   time.Time // when it was assigned, or when its last claim ended
	running bool      // a ConsumeClaim of it runs
	started int       // ConsumeClaims of it started in the session
	held    bool      // its claim is held back until its leader answers
	// asked: its leader was asked for it since it was assigned (Setup's
	// listing of starts, or holds for a claim added without Setup).
	asked   bool
	err     error // why it is not consumed, as last seen; nil: not known
	overdue bool  // reported (logged, and listed by Subscriber.Unclaimed)
	// released is when the watch stopped holding the claim back: Sarama
	// starts it at its next look (claimPollWait).
	released time.Time
}

func newClaimWatch(sub *subscription, client sarama.Client) *claimWatch {
	return &claimWatch{sub: sub, client: client, overdueAfter: claimOverdueAfter(sub.cfg.OverwriteSaramaConfig)}
}

// begin starts watching a session whose Setup found claimed assigned: the
// partitions in listErrs, whose start offsets their leaders did not answer
// for, are held back (Sarama would ask the same leaders as it starts their
// claims, fail, and end the session). It returns the held partitions.
func (w *claimWatch) begin(sess groupSession, claimed []int32, listErrs map[int32]error) map[int32]bool {
	now := time.Now()
	parts := make(map[int32]*claimState, len(claimed))
	held := make(map[int32]bool)
	for _, p := range claimed {
		st := &claimState{since: now, asked: true}
		if err := listErrs[p]; err != nil {
			st.held, st.err = true, err
			held[p] = true
		}
		parts[p] = st
	}
	stop := make(chan struct{})
	w.mu.Lock()
	w.sess, w.parts, w.stop = sess, parts, stop
	w.mu.Unlock()
	for p := range held {
		w.sub.logger.Info("The partition's leader did not answer; its claim waits until it does",
			w.sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "err": listErrs[p].Error()}))
	}
	go w.run(sess, stop)
	return held
}

// holds reports whether the claim of topic's partition is held back.
// Sarama asks just before it starts a claim. A claim a cooperative
// rebalance added to the session came without Setup, so its leader is
// asked here first, as Setup does: Sarama would ask the same leader for
// the claim's start, retry for the Metadata.Retry budget, give the claim
// up and end the session (and, at the next rebalance, the member's
// other claims with it).
func (w *claimWatch) holds(topic string, partition int32) bool {
	if topic != w.sub.topic {
		return false
	}
	w.mu.Lock()
	stop := w.stop
	st := w.parts[partition]
	if stop == nil || st != nil && (st.held || st.asked || st.running) {
		held := st != nil && st.held // read under mu: check releases claims
		w.mu.Unlock()
		return held
	}
	w.mu.Unlock()
	_, errs := kclient.ListOffsets(w.client, topic, []int32{partition}, sarama.OffsetNewest)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != stop {
		return false // the session ended meanwhile
	}
	st = w.stateLocked(partition)
	st.asked = true
	if err := errs[partition]; err != nil && !st.running {
		st.held, st.err = true, err
		w.sub.logger.Info("The leader of a partition added to the session did not answer; its claim waits until it does",
			w.sub.logFields.Add(watermill.LogFields{"kafka_partition": partition, "err": err.Error()}))
	}
	return st.held
}

// claimStarted records that a ConsumeClaim of partition started.
func (w *claimWatch) claimStarted(partition int32) {
	w.mu.Lock()
	st := w.stateLocked(partition)
	st.running, st.held = true, false
	st.started++
	overdue, waited := st.overdue, time.Since(st.since)
	st.overdue, st.err = false, nil
	w.mu.Unlock()
	if overdue {
		w.sub.host.RemoveUnclaimed(w.sub, partition)
		w.sub.logger.Info("The partition's claim started; it is consumed again",
			w.sub.logFields.Add(watermill.LogFields{"kafka_partition": partition, "waited": waited.Round(time.Millisecond).String()}))
	}
}

// claimEnded records that a ConsumeClaim of partition returned. A
// cooperative rebalance may add the partition back to the session later:
// the wait of its next claim counts from now.
func (w *claimWatch) claimEnded(partition int32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.stateLocked(partition)
	st.running, st.since, st.asked = false, time.Now(), false
}

// stateLocked returns partition's state, made when it is not in the
// assignment the watch knows (a claim a cooperative rebalance added since
// the last check). Callers hold mu.
func (w *claimWatch) stateLocked(partition int32) *claimState {
	if w.parts == nil {
		w.parts = make(map[int32]*claimState)
	}
	st := w.parts[partition]
	if st == nil {
		st = &claimState{since: time.Now()}
		w.parts[partition] = st
	}
	return st
}

// claimError records an error Sarama reported for partition (Errors()):
// for a partition not consumed, why its claim failed.
func (w *claimWatch) claimError(partition int32, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if st := w.parts[partition]; st != nil && !st.running {
		st.err = err
	}
}

// run checks the session's claims every claimCheckEvery until stop closes.
func (w *claimWatch) run(sess groupSession, stop <-chan struct{}) {
	t := time.NewTicker(claimCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-sess.Context().Done():
			return
		case <-t.C:
			w.check(sess, stop)
		}
	}
}

// check follows the assignment (a cooperative rebalance changes it without
// a new Setup), refreshes the metadata while a claim waits (Sarama's wait
// reads it), releases the held claims whose leaders answer, and reports the
// claims that are overdue.
func (w *claimWatch) check(sess groupSession, stop <-chan struct{}) {
	now := time.Now()
	assigned := sess.Claims()[w.sub.topic]
	var waiting, held, due []int32
	w.mu.Lock()
	for p := range w.parts {
		if !slices.Contains(assigned, p) {
			w.forgetLocked(p)
		}
	}
	for _, p := range assigned {
		st := w.stateLocked(p)
		if st.running {
			continue
		}
		if st.held {
			held = append(held, p)
		}
		if st.held || now.Sub(st.since) >= claimWaitGrace {
			waiting = append(waiting, p)
		}
		// A claim released lately starts at Sarama's next look.
		starting := now.Sub(st.released) < claimPollWait+claimCheckEvery
		if !st.overdue && !starting && now.Sub(st.since) >= w.overdueAfter {
			due = append(due, p)
		}
	}
	w.mu.Unlock()
	if len(waiting) == 0 {
		return
	}
	// The client's own answer, leaders missing or not: what it stores
	// is what Sarama's held-back claims look at.
	_ = w.client.RefreshMetadata(w.sub.topic)
	answered := w.probe(held)
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-stop:
		return // the session ended meanwhile: end cleared the assignment
	default:
	}
	for p := range answered {
		if st := w.parts[p]; st != nil && st.held {
			st.held, st.released = false, time.Now()
			w.sub.logger.Info("The partition's leader answers; its claim starts",
				w.sub.logFields.Add(watermill.LogFields{"kafka_partition": p}))
		}
	}
	for _, p := range due {
		st := w.parts[p]
		if st == nil || st.running || st.overdue || answered[p] {
			continue
		}
		st.overdue = true
		reason := st.err
		if reason == nil && w.client.PartitionNotReadable(w.sub.topic, p) {
			reason = errNoLeader
		}
		w.sub.host.AddUnclaimed(w.sub, Unclaimed{
			TopicPartition: TopicPartition{Topic: w.sub.topic, Partition: p},
			AssignedAt:     st.since,
			Since:          st.since,
			Err:            reason,
		})
		fields := watermill.LogFields{"kafka_partition": p, "waited": time.Since(st.since).Round(time.Millisecond).String()}
		if reason == nil {
			reason = errors.New("the claim has not started, and Sarama reported no error for it")
		}
		w.sub.logger.Error("A partition assigned to this member is not consumed: its claim cannot start; waiting for its leader",
			reason, w.sub.logFields.Add(fields))
	}
}

// probe asks the leaders of the held partitions for their start (as
// Setup did), and returns those that answered. A partition whose cached
// metadata names no leader is not asked: check refreshed it just before.
func (w *claimWatch) probe(held []int32) map[int32]bool {
	if len(held) == 0 {
		return nil
	}
	writable, err := w.client.WritablePartitions(w.sub.topic)
	if err != nil {
		return nil
	}
	var ask []int32
	for _, p := range held {
		if slices.Contains(writable, p) {
			ask = append(ask, p)
		}
	}
	if len(ask) == 0 {
		return nil
	}
	offsets, _ := kclient.ListOffsetsOnce(w.client, w.sub.topic, ask, sarama.OffsetNewest)
	answered := make(map[int32]bool, len(offsets))
	for p := range offsets {
		answered[p] = true
	}
	return answered
}

// forgetLocked drops partition from the watched assignment (revoked).
// Callers hold mu.
func (w *claimWatch) forgetLocked(partition int32) {
	if st := w.parts[partition]; st != nil && st.overdue {
		w.sub.host.RemoveUnclaimed(w.sub, partition)
	}
	delete(w.parts, partition)
}

// end stops watching the session, at its Cleanup. A session that Sarama
// ended because it gave up a claim (it ends the session when a claim
// returns without being revoked, and one whose start failed never ran
// ConsumeClaim) is logged, and makes the next rejoin wait (see
// rejoinDelay).
func (w *claimWatch) end(sess groupSession) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		close(w.stop)
		w.stop = nil
	}
	var failed []int32
	var cause error
	if errors.Is(context.Cause(sess.Context()), sarama.ErrSessionConsumeClaimExited) {
		for p, st := range w.parts {
			if !st.running && st.started == 0 && !st.held {
				failed = append(failed, p)
				cause = firstErr(cause, st.err)
			}
		}
	}
	for p := range w.parts {
		w.forgetLocked(p)
	}
	w.sess, w.parts = nil, nil
	if len(failed) == 0 {
		w.failures = 0
		return
	}
	w.failures++
	slices.Sort(failed)
	if cause == nil {
		cause = errors.New("the claim could not start, and Sarama reported no error for it")
	}
	w.sub.logger.Error("Sarama gave up the claim of a partition assigned to this member, which ended the session; rejoining",
		cause, w.sub.logFields.Add(watermill.LogFields{
			"kafka_partitions": fmt.Sprint(failed), "rejoin_in": w.rejoinDelayLocked().String(),
		}))
}

// firstErr returns the first of a and b that is not nil.
func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// rejoinDelay is how long to wait before rejoining after the session that
// just ended: 0, unless Sarama gave a claim up, which would make the
// member rejoin in a loop for as long as the fault lasts (each round ends
// the member's session, and a group leader's rejoin rebalances the whole
// group). The wait doubles with each such session in a row, from a
// second up to half the session timeout: a member that waits longer is
// expelled from the group, and its other partitions move.
func (w *claimWatch) rejoinDelay() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rejoinDelayLocked()
}

func (w *claimWatch) rejoinDelayLocked() time.Duration {
	if w.failures == 0 {
		return 0
	}
	limit := max(w.sub.cfg.OverwriteSaramaConfig.Consumer.Group.Session.Timeout/2, time.Second)
	d := time.Second << min(w.failures-1, 16)
	return min(d, limit)
}
