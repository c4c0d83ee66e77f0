package safeack_test

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// closeFault is what the brokers do from the moment Close is called.
type closeFault int

const (
	commitsSlow        closeFault = iota // OffsetCommit answered after closeSlowAnswer: within the bound
	commitsUnanswered                    // OffsetCommit never answered
	commitsRefused                       // every OffsetCommit refused (COORDINATOR_LOAD_IN_PROGRESS)
	brokersUnanswering                   // no request answered (but Metadata)
	fetchesUnanswered                    // Fetch never answered; the group coordinator answers
	brokersGone                          // the cluster is closed
)

// closeLeftGrace is how long after Close returned the goroutines of its
// subscriber may take to end: the last steps after closing the output
// channel (returning, running defers; a commit loop's or a transactional
// producer's last request, failing at once on its closed connection), on
// a loaded machine: at load 14 on two cores they took over a second.
const closeLeftGrace = 3 * time.Second

// closeSlowAnswer is how late commitsSlow answers a commit.
const closeSlowAnswer = 2 * time.Second

// closeBound is how long Close may take at the defaults, whatever the
// brokers do: DrainTimeout, then the final commit's wait, then a second
// to leave the group and one for the connections closed under the last
// calls (see Subscriber.Close); closeSlack is the test's margin for a
// loaded machine.
const (
	closeBound = safeack.DefaultDrainTimeout + 5*time.Second + 2*time.Second
	closeSlack = 2 * time.Second
)

// userTimeouts makes a test Sarama config use the timeouts a user gets:
// Sarama's defaults for the network (30 s to dial, read and write) and
// for Rebalance.Timeout (60 s, which bounds DrainTimeout and the final
// commit's wait). A secured cluster's TLS and SASL login stay.
func userTimeouts(sc *sarama.Config) {
	def := sarama.NewConfig()
	tls, sasl := sc.Net.TLS, sc.Net.SASL
	sc.Net = def.Net
	sc.Net.TLS, sc.Net.SASL = tls, sasl
	sc.Consumer.Group.Rebalance.Timeout = def.Consumer.Group.Rebalance.Timeout
}

// injectCloseFault starts fault on c's embedded broker and returns what
// turns it off (nil for brokersGone). Faults on commits affect group only.
func injectCloseFault(t *testing.T, c *kafkatest.Cluster, group string, fault closeFault) (off func()) {
	t.Helper()
	kf := c.Kfake()
	var on atomic.Bool
	on.Store(true)
	switch fault {
	case brokersGone:
		kf.Close()
		return nil
	case fetchesUnanswered:
		var swallowed atomic.Int32
		kf.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
			kf.KeepControl()
			if !on.Load() {
				return nil, nil, false
			}
			swallowed.Add(1)
			return nil, nil, true
		})
		// Close comes while a Fetch waits for its answer.
		kafkatest.WaitFor(t, 10*time.Second, "a Fetch left unanswered", func() bool { return swallowed.Load() > 0 })
	case brokersUnanswering:
		kf.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
			kf.KeepControl()
			// Handled without an answer. Metadata is answered: the
			// harness's own client refreshes it meanwhile, and would
			// wait minutes for it at the test's end.
			return nil, nil, on.Load() && req.Key() != kmsg.Metadata.Int16()
		})
	default:
		kf.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			kf.KeepControl()
			oc := req.(*kmsg.OffsetCommitRequest)
			if !on.Load() || oc.Group != group {
				return nil, nil, false
			}
			switch fault {
			case commitsSlow:
				kf.SleepControl(func() { time.Sleep(closeSlowAnswer) })
				return nil, nil, false
			case commitsUnanswered:
				return nil, nil, true
			}
			resp := oc.ResponseKind().(*kmsg.OffsetCommitResponse)
			resp.SetVersion(oc.GetVersion())
			for _, rt := range oc.Topics {
				st := kmsg.NewOffsetCommitResponseTopic()
				st.Topic = rt.Topic
				for _, rp := range rt.Partitions {
					sp := kmsg.NewOffsetCommitResponseTopicPartition()
					sp.Partition, sp.ErrorCode = rp.Partition, kerr.CoordinatorLoadInProgress.Code
					st.Partitions = append(st.Partitions, sp)
				}
				resp.Topics = append(resp.Topics, st)
			}
			return resp, nil, true
		})
	}
	return func() { on.Store(false) }
}

// restartFromDisk starts a broker on the address of c (closed) with the
// state c persisted in dir, to read what c held when it went away.
func restartFromDisk(t *testing.T, c *kafkatest.Cluster, dir string) *kafkatest.Cluster {
	t.Helper()
	_, portStr, err := net.SplitHostPort(c.Brokers()[0])
	require.NoError(t, err)
	port, err := strconv.Atoi(portStr)
	require.NoError(t, err)
	return kafkatest.Start(t, kafkatest.WithKfakeOpts(kfake.DataDir(dir), kfake.Ports(port)))
}

// timeClose calls Close and returns how long it took; it fails the test
// if Close has not returned after limit (far above any bound, so that the
// time taken before a fix can be read).
func timeClose(t *testing.T, sub *safeack.Subscriber, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- sub.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(limit):
		t.Fatalf("Close has not returned after %v", limit)
	}
	return time.Since(start)
}

// uncommittedLogged returns, per partition, the offsets that Error
// entries of logs about topic list as not committed ("uncommitted":
// "p:offset p:offset ...").
func uncommittedLogged(logs *watermill.CaptureLoggerAdapter, topic string) map[int32][]int64 {
	out := make(map[int32][]int64)
	for _, e := range logs.Captured()[watermill.ErrorLogLevel] {
		if e.Fields["topic"] != topic {
			continue
		}
		list, _ := e.Fields["uncommitted"].(string)
		for _, tok := range strings.Fields(list) {
			var p int32
			var off int64
			if _, err := fmt.Sscanf(tok, "%d:%d", &p, &off); err == nil {
				out[p] = append(out[p], off)
			}
		}
	}
	return out
}

// TestCloseBoundedWhateverTheBrokersDo closes a subscriber (at the
// defaults a user gets: Sarama's 30 s network timeouts, DrainTimeout 5 s)
// of 8 partitions whose handlers finish during the drain, so that every
// partition's final position is past what the group holds, while the
// brokers answer commits late, never, refuse them, answer nothing, or are
// gone. Close returns within closeBound every time; what the brokers take
// is committed (read at the broker afterwards, from disk when they were
// gone), and every final position the group does not hold is named,
// partition and offset, in an Error.
func TestCloseBoundedWhateverTheBrokersDo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault closeFault
	}{
		{"commits-slow", commitsSlow},
		{"commits-unanswered", commitsUnanswered},
		{"commits-refused", commitsRefused},
		{"brokers-unanswering", brokersUnanswering},
		{"fetches-unanswered", fetchesUnanswered},
		{"brokers-gone", brokersGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testCloseBounded(t, tc.fault)
		})
	}
}

func testCloseBounded(t *testing.T, fault closeFault) {
	const partitions, perPartition, holdAt = 8, 30, 20
	dir := t.TempDir()
	c := kafkatest.Start(t, kafkatest.WithKfakeOpts(kfake.DataDir(dir)))
	c.RequireEmbedded(t)
	topic := c.NewTopic(t, partitions)
	group := c.NewGroup(t)
	c.ProduceN(t, topic, partitions, partitions*perPartition, nil)
	commits := c.ObserveCommits(t)

	logs := watermill.NewCaptureLogger()
	var sub *safeack.Subscriber
	var msgs <-chan *message.Message
	scope := newGoroutineScope(t)
	scope.inScope(func() {
		sub = newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) {
			userTimeouts(cfg.OverwriteSaramaConfig)
			cfg.DrainTimeout = 0 // DefaultDrainTimeout
			cfg.Ordering = safeack.Unordered
		})
		msgs = mustSubscribe(t, sub, topic)
	})
	var holds []po
	for p := range int32(partitions) {
		holds = append(holds, po{p, holdAt})
	}
	hold := newHolder(holds...)
	acks := newAckLog()
	outputClosed := handleAll(msgs, func(m *message.Message) {
		if hold.take(m) {
			// Finishes once Close began: the final position moves past
			// what the group holds.
			for !safeack.AssignmentEnded(m) {
				time.Sleep(5 * time.Millisecond)
			}
		}
		acks.ack(m)
	})
	want := make(map[int32]int64, partitions)
	final := make(map[int32]int64, partitions)
	for p := range int32(partitions) {
		want[p], final[p] = holdAt, perPartition
	}
	kafkatest.WaitFor(t, 30*time.Second, "every record but the held ones acked", func() bool {
		return len(acks.missing(c, topic)) == partitions && hold.count() == partitions
	})
	commits.WaitForOffsets(t, 20*time.Second, group, topic, want)
	// Sent is not held: the broker may close (brokersGone) before it
	// stored the last of them, which it then never held.
	kafkatest.WaitFor(t, 20*time.Second, "the broker to hold the commits", func() bool {
		held := c.CommittedOffsets(t, group, topic)
		for p, off := range want {
			if held[p].Offset != off {
				return false
			}
		}
		return true
	})

	off := injectCloseFault(t, c, group, fault)
	// SAFEACK_CLOSE_DUMP=4s writes the goroutines that long into Close
	// to a file, named in the log.
	if at, err := time.ParseDuration(os.Getenv("SAFEACK_CLOSE_DUMP")); err == nil {
		dump := time.AfterFunc(at, func() { t.Logf("goroutines %v into Close: %s", at, dumpGoroutines(t)) })
		defer dump.Stop()
	}
	took := timeClose(t, sub, 3*time.Minute)
	t.Logf("Close took %v", took.Round(time.Millisecond))
	select {
	case <-outputClosed:
	case <-time.After(time.Second): // the reader's last receive
		t.Fatalf("the output channel is still open after Close returned (Close took %v); goroutines: %s",
			took.Round(time.Millisecond), dumpGoroutines(t))
	}
	scope.requireNoneLeft(t, closeLeftGrace, "Close returned")
	require.Empty(t, sub.Stats())
	require.Less(t, took, closeBound+closeSlack, "Close took longer than its bound")

	// What the brokers took, read at the broker.
	at := c
	if off != nil {
		off()
	} else {
		at = restartFromDisk(t, c, dir)
	}
	committed := make(map[int32]int64, partitions)
	for p, co := range at.CommittedOffsets(t, group, topic) {
		committed[p] = co.Offset
	}
	if fault == commitsSlow || fault == fetchesUnanswered {
		require.Equal(t, final, committed, "a commit answered within the bound is held")
	} else {
		require.Equal(t, want, committed, "nothing past the held records could be committed")
	}
	// Every final position the group does not hold is reported.
	logged := uncommittedLogged(logs, topic)
	for p := range int32(partitions) {
		if committed[p] < final[p] {
			require.Contains(t, logged[p], final[p], "partition %d: final position %d not committed (the group holds %d) and not reported", p, final[p], committed[p])
		} else {
			require.Empty(t, logged[p], "partition %d reported uncommitted although the group holds %d", p, committed[p])
		}
	}
}

// TestTxnCloseBounded closes a transactional subscriber (at the defaults
// a user gets: Sarama's 30 s network timeouts and transaction retries,
// DrainTimeout 5 s) while the broker never answers EndTxn, or while the
// brokers are gone: Close returns within closeBound, an Error names the
// transaction it abandoned, and a successor with the same transactional
// id (which aborts it) brings the outputs to exactly once.
func TestTxnCloseBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault closeFault
	}{
		{"endtxn-unanswered", commitsUnanswered},
		{"brokers-gone", brokersGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testTxnCloseBounded(t, tc.fault)
		})
	}
}

func testTxnCloseBounded(t *testing.T, fault closeFault) {
	dir := t.TempDir()
	c := kafkatest.Start(t, kafkatest.WithKfakeOpts(kfake.DataDir(dir)))
	c.RequireEmbedded(t)
	r := newTxnRig(t, c, 2, 4000)
	ids := r.inputIDs()
	var att attempts
	logs := watermill.NewCaptureLogger()
	txnID := "txn-close-bounded-" + strconv.Itoa(int(fault))
	users := func(cfg *safeack.SubscriberConfig, tc *safeack.TxnConfig) {
		userTimeouts(cfg.OverwriteSaramaConfig)
		userTimeouts(tc.OverwriteSaramaConfig)
		cfg.DrainTimeout = 0
	}
	var sub1 *safeack.Subscriber
	var pub1 *safeack.TxnPublisher
	var stop1 func()
	var outputs atomic.Int64
	scope := newGoroutineScope(t)
	scope.inScope(func() {
		sub1, pub1 = r.loggedSubscriber(t, txnID, logs, users)
		stop1 = runRouter(t, r, sub1, pub1, func(msg *message.Message) ([]*message.Message, error) {
			outputs.Add(1)
			return transform(&att, 50*time.Millisecond)(msg) // still at work when Close comes
		})
	})
	kafkatest.WaitFor(t, 60*time.Second, "some transactions", func() bool {
		return pub1.Stats().Committed > 3 && outputs.Load() > 200
	})

	kf := c.Kfake()
	var on atomic.Bool
	var swallowed atomic.Int32
	if fault == brokersGone {
		kf.Close()
	} else {
		on.Store(true)
		kf.ControlKey(kmsg.EndTxn.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
			kf.KeepControl()
			if !on.Load() {
				return nil, nil, false
			}
			swallowed.Add(1)
			return nil, nil, true
		})
		kafkatest.WaitFor(t, 10*time.Second, "an EndTxn left unanswered", func() bool { return swallowed.Load() > 0 })
	}
	took := timeClose(t, sub1, 3*time.Minute)
	t.Logf("Close took %v; %+v", took.Round(time.Millisecond), pub1.Stats())
	stop1()
	require.Less(t, took, closeBound+closeSlack, "Close took longer than its bound")
	scope.requireNoneLeft(t, closeLeftGrace, "Close and the router's Close returned")
	abandoned := false
	for _, e := range logs.Captured()[watermill.ErrorLogLevel] {
		if e.Fields["transactional_id"] == txnID+"-"+r.in && strings.Contains(e.Msg, "abandon") {
			abandoned = true
			t.Logf("logged: %s %v", e.Msg, e.Fields)
		}
	}
	require.True(t, abandoned, "no Error names the abandoned transaction")

	if fault == brokersGone {
		r.c = restartFromDisk(t, c, dir)
	} else {
		on.Store(false)
	}
	rd := readOutputs(t, r.c, r.out, r.parts, sarama.ReadCommitted)
	sub2, pub2 := r.subscriber(t, txnID, nil)
	runRouter(t, r, sub2, pub2, transform(&att, time.Millisecond))
	r.requireExactlyOnce(t, rd, ids, 90*time.Second, 30*time.Second)
}
