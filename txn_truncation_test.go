package safeack_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
)

// hdrElected marks an output whose input was handled after the test's
// leader election: an input of the new leader.
const hdrElected = "elected"

// electionRouter runs the rig's transactional router on one member
// (cooperative-sticky when cooperative): each input's output carries its
// attempt, and hdrElected once elected is set.
func electionRouter(t *testing.T, r *txnRig, cooperativeBalance bool, elected *atomic.Bool, att *attempts) *safeack.Subscriber {
	t.Helper()
	sub, pub := r.subscriber(t, "txn-election", func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		if cooperativeBalance {
			cooperative(cfg)
		}
	})
	runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		out := outputOf(msg, att.next(msg))
		if elected.Load() {
			out.Metadata.Set(hdrElected, "1")
		}
		return []*message.Message{out}, nil
	})
	return sub
}

// txnElection is a transactional router on one member (see
// electionRouter) that has committed the n inputs of its one-partition
// topic, each with its output read back: the set-up of an election test.
type txnElection struct {
	c       *kafkatest.Cluster
	r       *txnRig
	sub     *safeack.Subscriber
	rd      *outputReader
	elected atomic.Bool // set it at the election
	att     attempts
	before  kafkatest.CommittedOffset // the commit of the n inputs
}

func startTxnElection(t *testing.T, cooperativeBalance bool, n int) *txnElection {
	t.Helper()
	c := kafkatest.Start(t)
	c.RequireEmbedded(t)
	e := &txnElection{c: c, r: newTxnRig(t, c, 1, n)}
	e.sub = electionRouter(t, e.r, cooperativeBalance, &e.elected, &e.att)
	e.rd = readOutputs(t, c, e.r.out, e.r.parts, sarama.ReadCommitted)
	e.before = waitCommitted(t, c, e.r.group, e.r.in, int64(n), "every input committed before the election")
	e.rd.waitAll(t, e.r.inputIDs(), 30*time.Second)
	return e
}

// waitElectedOutputs waits until every input from diverged to end (of
// partition 0) has an output handled after the election and every input
// is committed, then reads the outputs to the end.
func (e *txnElection) waitElectedOutputs(t *testing.T, diverged, end int64) {
	t.Helper()
	kafkatest.WaitFor(t, 30*time.Second, "an output of every record from the divergence on, handled after the election", func() bool {
		for off := diverged; off < end; off++ {
			if _, elected := e.rd.outputsOf(fmt.Sprintf("0@%d", off)); elected == 0 {
				return false
			}
		}
		return true
	})
	e.r.waitCommittedAll(t, 30*time.Second)
	e.rd.complete(t, e.c, e.r.out, e.r.parts)
}

// outputsOf returns how many outputs of id rd read, and how many of them
// carry hdrElected.
func (rd *outputReader) outputsOf(id string) (all, elected int) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, m := range rd.byID[id] {
		all++
		if headerOf(m, hdrElected) != "" {
			elected++
		}
	}
	return all, elected
}

func totalsOf(sub *safeack.Subscriber) (truncations, assignments uint64) {
	for _, tt := range sub.Totals() {
		truncations += tt.LogTruncations
		assignments += tt.Assignments
	}
	return truncations, assignments
}

// TestTxnTruncatedLogWhileConsuming is TestTruncatedLogWhileConsuming in
// transactional mode: an unclean leader election truncates the log of a
// partition a transactional router is consuming, below inputs whose
// outputs and positions it has committed; the new leader writes new
// records at the reused offsets. The outputs of the old leader's records
// are committed and stay (that cannot be undone). What must hold is that
// every record the new leader holds from the divergence on gets exactly
// one output, and the group's commit reaches the end. The transactions'
// positions carry the leader epoch the claim validated; when the metadata
// names the new epoch, the claim asks the new leader where the validated
// one ends, finds the log truncated below what it took, commits the
// divergence point and ends the assignment: the next one handles every
// record from there. Before, transactions committed the epoch the metadata
// named (sampled): the member went on consuming past the reused offsets,
// its positions carried the new epoch, which the next start found
// consistent, and the new leader's records at the reused offsets never got
// an output.
//
// With the next start's check refused (a missing ACL, a timeout: the
// commit is trusted as it is), only the committed divergence point brings
// those records back: a transaction must commit it though it covers less
// than the last one.
//
// The new leader is played as in TestTruncatedLogWhileConsuming.
func TestTxnTruncatedLogWhileConsuming(t *testing.T) {
	t.Parallel()
	kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperativeBalance bool) {
		eachStartCheck(t, func(t *testing.T, startCheckRefused bool) {
			txnTruncatedWhileConsuming(t, cooperativeBalance, startCheckRefused)
		})
	})
}

func txnTruncatedWhileConsuming(t *testing.T, cooperativeBalance, startCheckRefused bool) {
	const n, diverged, more = 10, 6, 5
	e := startTxnElection(t, cooperativeBalance, n)
	c, r, rd := e.c, e.r, e.rd
	oldEpoch, ok := frontier.LeaderEpochOf(e.before.Metadata)
	require.True(t, ok, "the commit carries no leader epoch: %q", e.before.Metadata)

	// The election: the old epoch ends at diverged in the new log.
	asked := answerElection(c, r.in, diverged, startCheckRefused)
	e.elected.Store(true)
	bumpLeaderEpoch(t, c, r.in)
	r.inputs = append(r.inputs, c.ProduceN(t, r.in, 1, more, nil)...) // n..n+more-1, in the new epoch

	e.waitElectedOutputs(t, diverged, n+more)
	require.Positive(t, asked.Load(), "the new leader was not asked where the validated epoch ends")

	for off := int64(0); off < n+more; off++ {
		all, elected := rd.outputsOf(fmt.Sprintf("0@%d", off))
		switch {
		case off < diverged: // the old leader's, still in the log
			require.Equal(t, 1, all, "outputs of %d", off)
		case off < n: // the old leader's output stays; the new leader's record gets one
			require.Equal(t, 1, elected, "outputs of the new leader's record at %d", off)
			require.LessOrEqual(t, all, 2, "outputs of %d", off)
		default:
			require.Equal(t, 1, all, "outputs of %d", off)
		}
	}
	held := c.CommittedOffsets(t, r.group, r.in)[0]
	epoch, ok := frontier.LeaderEpochOf(held.Metadata)
	require.True(t, ok && epoch > oldEpoch, "the last commit carries epoch %d (ok %v), not the new one", epoch, ok)
	truncations, _ := totalsOf(e.sub)
	require.Positive(t, truncations, "the truncation is counted")
}

// TestTxnTruncatedLogUnderCommitStartCheckRefused is
// TestTruncatedLogUnderCommitStartCheckRefused in transactional mode: an
// unclean leader election truncates the log under the inputs a
// transactional router committed, while no member runs; the next member's
// start check is refused (a storage error, which trying again may cure).
// Its claim starts at the commit and checks the commit's epoch while it
// consumes, with the positions held at the commit until an answer comes:
// the records it takes meanwhile (the new leader's, past the commit) get
// no output committed. The answer names the divergence below the claim's
// start: a transaction commits the position there, though it covers less
// than the group's commit, and the assignment ends. Every record the new
// leader holds from the divergence on then gets exactly one output (the
// old leader's outputs stay). Before, the claim took the metadata's new
// epoch as validated and never checked the commit's: the new leader's
// records below the commit never got an output.
//
// The claim's own checks are answered at once, or refused too until an
// output of a record past the commit shows or 3 s passed (none may show:
// their positions are held). After a clean election (the commit's epoch
// ends at the commit) every input gets exactly one output, and the
// transactions' positions come to carry the new epoch.
func TestTxnTruncatedLogUnderCommitStartCheckRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		diverged      int64 // where the commit's epoch ends in the new log; 10, the commit: a clean election
		claimsRefused bool
	}{
		{name: "claim's check answered", diverged: 6},
		{name: "claim's checks refused a while", diverged: 6, claimsRefused: true},
		{name: "clean election", diverged: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperativeBalance bool) {
				txnTruncatedUnderCommitStartCheckRefused(t, cooperativeBalance, tc.diverged, tc.claimsRefused)
			})
		})
	}
}

func txnTruncatedUnderCommitStartCheckRefused(t *testing.T, cooperativeBalance bool, diverged int64, claimsRefused bool) {
	const n, more = 10, 5
	e := startTxnElection(t, cooperativeBalance, n)
	c, r, rd := e.c, e.r, e.rd
	oldEpoch, ok := frontier.LeaderEpochOf(e.before.Metadata)
	require.True(t, ok, "the commit carries no leader epoch: %q", e.before.Metadata)
	require.NoError(t, e.sub.Close()) // no member runs
	waitCommitted(t, c, r.group, r.in, n, "the group's commit kept at the close")

	var asked *atomic.Int32
	if claimsRefused {
		asked = answerElectionRefused(c, r.in, diverged, func() bool {
			for off := int64(n); off < n+more; off++ {
				if all, _ := rd.outputsOf(fmt.Sprintf("0@%d", off)); all > 0 {
					return true
				}
			}
			return false
		})
	} else {
		asked = answerStartCheckRefusedOnce(c, r.in, diverged)
	}
	e.elected.Store(true)
	bumpLeaderEpoch(t, c, r.in)
	r.inputs = append(r.inputs, c.ProduceN(t, r.in, 1, more, nil)...) // n..n+more-1, in the new epoch
	e.sub = electionRouter(t, r, cooperativeBalance, &e.elected, &e.att)

	if diverged >= n {
		kafkatest.WaitFor(t, 30*time.Second, "a commit of every input carrying the new epoch", func() bool {
			held := c.CommittedOffsets(t, r.group, r.in)[0]
			epoch, ok := frontier.LeaderEpochOf(held.Metadata)
			return held.Offset == n+more && ok && epoch > oldEpoch
		})
		r.requireExactlyOnce(t, rd, r.inputIDs(), 30*time.Second, 30*time.Second)
		truncations, _ := totalsOf(e.sub)
		require.Zero(t, truncations, "a clean leader change was taken for a truncation")
		return
	}
	e.waitElectedOutputs(t, diverged, n+more)
	require.Greater(t, asked.Load(), int32(1), "the commit's epoch was not checked again after the start's check was refused")
	for off := int64(0); off < n+more; off++ {
		all, elected := rd.outputsOf(fmt.Sprintf("0@%d", off))
		switch {
		case off < diverged: // the old leader's, still in the log
			require.Equal(t, 1, all, "outputs of %d", off)
		case off < n: // the old leader's output stays; the new leader's record gets one
			require.Equal(t, 1, elected, "outputs of the new leader's record at %d", off)
			require.Equal(t, 2, all, "outputs of %d", off)
		default:
			require.Equal(t, 1, all, "outputs of %d", off)
		}
	}
	truncations, _ := totalsOf(e.sub)
	require.Positive(t, truncations, "the truncation is counted")
}

// TestTxnLeaderChangeWhileConsuming is TestLeaderChangeWhileConsuming in
// transactional mode: a clean leader election while a transactional
// router consumes is no truncation. Every input gets exactly one output
// and is handled once, the assignment is not ended, and the transactions'
// positions come to carry the new epoch.
func TestTxnLeaderChangeWhileConsuming(t *testing.T) {
	t.Parallel()
	kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperativeBalance bool) {
		const n, more = 10, 10
		e := startTxnElection(t, cooperativeBalance, n)
		c, r := e.c, e.r
		oldEpoch, ok := frontier.LeaderEpochOf(e.before.Metadata)
		require.True(t, ok, "the commit carries no leader epoch: %q", e.before.Metadata)

		bumpLeaderEpoch(t, c, r.in)
		r.inputs = append(r.inputs, c.ProduceN(t, r.in, 1, more, nil)...)

		kafkatest.WaitFor(t, 30*time.Second, "a commit of every input carrying the new epoch", func() bool {
			held := c.CommittedOffsets(t, r.group, r.in)[0]
			epoch, ok := frontier.LeaderEpochOf(held.Metadata)
			return held.Offset == n+more && ok && epoch > oldEpoch
		})
		r.requireExactlyOnce(t, e.rd, r.inputIDs(), 30*time.Second, 30*time.Second)
		e.att.mu.Lock()
		for id, handled := range e.att.n {
			require.Equal(t, 1, handled, "input %s handled other than once", id)
		}
		e.att.mu.Unlock()
		truncations, assignments := totalsOf(e.sub)
		require.Zero(t, truncations, "a clean leader change was taken for a truncation")
		require.EqualValues(t, 1, assignments, "the assignment was ended")
	})
}

// answerElectionLate is answerElection (the start checks answered) with
// the first request, the consuming member's check of the new epoch,
// answered late: once until holds, or after 3 s. It reports when that
// request reached the broker.
func answerElectionLate(c *kafkatest.Cluster, topic string, diverged int64, until func() bool) (arrived func() bool) {
	var got atomic.Bool
	kf := c.Kfake()
	answerEpochEnds(c, topic, func(answered int32) (int64, int16) {
		if answered == 0 && got.CompareAndSwap(false, true) {
			// Other requests go on meanwhile (SleepControl yields).
			kf.SleepControl(func() { kafkatest.Poll(3*time.Second, 10*time.Millisecond, until) })
		}
		return diverged, 0
	})
	return got.Load
}

// answerElectionRefused is answerElection (the start checks answered)
// with the consuming member's checks of the new epoch refused with a
// storage error (which trying again may cure) until holds, or for 3 s
// from the first. It reports how many were refused.
func answerElectionRefused(c *kafkatest.Cluster, topic string, diverged int64, until func() bool) (refused *atomic.Int32) {
	refused = new(atomic.Int32)
	var deadline atomic.Int64 // unix nanoseconds; 0: nothing refused yet
	answerEpochEnds(c, topic, func(int32) (int64, int16) {
		deadline.CompareAndSwap(0, time.Now().Add(3*time.Second).UnixNano())
		if !until() && time.Now().UnixNano() < deadline.Load() {
			refused.Add(1)
			return 0, 56 // KAFKA_STORAGE_ERROR: retriable
		}
		return diverged, 0
	})
	return refused
}

// txnElectionCheckDelayed runs a transactional router through an unclean
// election whose new epoch the consuming member cannot have checked at
// once: answer installs the answers to its checks (naming the divergence
// at diverged, and told whether an output of a record the new leader
// wrote past the member's position shows) and reports when the first
// check reached the broker. Those records are produced once it did; each
// record from the divergence on must then get an output, and every record
// past the old log's end exactly one.
func txnElectionCheckDelayed(t *testing.T, cooperativeBalance bool,
	answer func(c *kafkatest.Cluster, topic string, diverged int64, newOutput func() bool) (checked func() bool)) *safeack.Subscriber {
	t.Helper()
	const n, diverged, more = 10, 6, 5
	e := startTxnElection(t, cooperativeBalance, n)
	c, r, rd := e.c, e.r, e.rd
	checked := answer(c, r.in, diverged, func() bool {
		for off := int64(n); off < n+more; off++ {
			if all, _ := rd.outputsOf(fmt.Sprintf("0@%d", off)); all > 0 {
				return true
			}
		}
		return false
	})
	e.elected.Store(true)
	bumpLeaderEpoch(t, c, r.in)
	kafkatest.WaitFor(t, 30*time.Second, "the member's check of the new epoch", checked)
	r.inputs = append(r.inputs, c.ProduceN(t, r.in, 1, more, nil)...) // n..n+more-1: past the member's position

	e.waitElectedOutputs(t, diverged, n+more)
	for off := int64(0); off < n+more; off++ {
		all, _ := rd.outputsOf(fmt.Sprintf("0@%d", off))
		switch {
		case off < diverged || off >= n:
			require.Equal(t, 1, all, "outputs of %d", off)
		default: // the old leader's output stays; the new leader's record gets one
			require.LessOrEqual(t, all, 2, "outputs of %d", off)
		}
	}
	return e.sub
}

// TestTxnTruncatedLogSlowCheck: the new leader answers the consuming
// member's check of the new epoch late, after the member fetched and
// handled records the new leader wrote past its position (as on a busy
// partition). Those records are in the log; each must get exactly one
// output. Before, the marks went on while the check was under way: a
// transaction committed a position covering them, with their outputs;
// the answer then named a divergence below them, and the next assignment
// handled them again and committed their outputs a second time. The
// marks are now held at what the claim had taken when it saw the new
// epoch until the answer comes. Found on a real cluster by
// TestClusterTxnUncleanElectionWhileConsuming (chaos/).
func TestTxnTruncatedLogSlowCheck(t *testing.T) {
	t.Parallel()
	kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperativeBalance bool) {
		txnElectionCheckDelayed(t, cooperativeBalance, answerElectionLate)
	})
}

// TestTxnTruncatedLogCheckRefused is TestTxnTruncatedLogSlowCheck with the
// consuming member's checks of the new epoch refused (a storage error,
// which trying again may cure) instead of answered late, until an output
// of a record past the member's position shows or 3 s passed; then the
// new leader names the divergence. Before, a check that could not run let
// the marks through: a transaction committed the new records with their
// outputs, and once the check ran they were handled and their outputs
// committed again. In transactional mode the marks now stay held until an
// answer comes.
func TestTxnTruncatedLogCheckRefused(t *testing.T) {
	t.Parallel()
	kafkatest.EagerAndCooperative(t, func(t *testing.T, cooperativeBalance bool) {
		var refused *atomic.Int32
		sub := txnElectionCheckDelayed(t, cooperativeBalance, func(c *kafkatest.Cluster, topic string, diverged int64, newOutput func() bool) func() bool {
			refused = answerElectionRefused(c, topic, diverged, newOutput)
			return func() bool { return refused.Load() > 0 }
		})
		require.Greater(t, refused.Load(), int32(1), "the check was not tried again after it was refused")
		truncations, _ := totalsOf(sub)
		require.Positive(t, truncations, "the truncation is counted")
	})
}
