package safeack_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// Environment of the transactional router child process.
const (
	envTxnChild     = "SAFEACK_TEST_TXN_CHILD" // "1" in the child
	envTxnChildIn   = "SAFEACK_TEST_TXN_IN"
	envTxnChildOut  = "SAFEACK_TEST_TXN_OUT"
	envTxnChildGrp  = "SAFEACK_TEST_TXN_GROUP"
	envTxnChildID   = "SAFEACK_TEST_TXN_ID"
	envTxnChildCoop = "SAFEACK_TEST_TXN_COOP" // "1": cooperative-sticky balancing

	// txnChildStopAt is how many inputs' outputs the parent waits to see
	// before it stops or kills the child; the child handles a few more
	// than that (txnChildFastRecords) at full speed, then slowly.
	txnChildStopAt      = 500
	txnChildFastRecords = 600
)

// TestHelperTxnRouterProcess is not a test: TestTxnRouterSIGKILL re-executes
// the test binary to run it as a transactional router process it can
// SIGKILL. It runs until it is killed, or until its stdin closes (the
// parent died).
func TestHelperTxnRouterProcess(t *testing.T) {
	if os.Getenv(envTxnChild) != "1" {
		t.Skip("helper process for TestTxnRouterSIGKILL")
	}
	c := kafkatest.Start(t) // the parent's cluster, through SAFEACK_KAFKA_BROKERS
	r := &txnRig{c: c, in: os.Getenv(envTxnChildIn), out: os.Getenv(envTxnChildOut), group: os.Getenv(envTxnChildGrp)}
	sub, pub := r.subscriber(t, os.Getenv(envTxnChildID), func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		cfg.MaxInFlight = 8 // slow enough that the kill lands mid-stream on a fast broker too
		if c.Embedded() {
			shortSessions(cfg.OverwriteSaramaConfig)
		}
		if os.Getenv(envTxnChildCoop) == "1" {
			cooperative(cfg)
		}
	})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	go func() {
		// The parent reads what became of this member's transactions.
		for range time.Tick(50 * time.Millisecond) {
			st := pub.Stats()
			fmt.Printf("STATS %d %d\n", st.Committed, st.Aborted)
		}
	}()
	var att attempts
	// Quick for the first records, then slow (about 80 a second): the
	// parent stops or kills this process once its reader sees the first
	// outputs, and most of the input must still be to do then, however
	// late that reader is. At full speed the rest took under a second, and
	// on a loaded CI machine the reader once saw every output at its first
	// look (commits took up to 12 s in a local run under heavier load).
	fast, slow := transform(&att, 3*time.Millisecond), transform(&att, 200*time.Millisecond)
	var handled atomic.Int64
	paced := func(msg *message.Message) ([]*message.Message, error) {
		if handled.Add(1) <= txnChildFastRecords {
			return fast(msg)
		}
		return slow(msg)
	}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	router.AddMiddleware(pub.Middleware)
	router.AddHandler("transform", r.in, sub, r.out, pub, paced)
	_ = router.Run(context.Background())
	select {} // killed by the parent
}

// shortSessions lets the embedded broker evict a killed member quickly (but
// not so quickly that a loaded machine expels a live one).
func shortSessions(sc *sarama.Config) {
	kafkatest.KillableSessions(sc)
}

// A transactional router process is SIGKILLed mid-stream, with handlers
// running and transactions open or committing. A new instance with the
// same transactional id takes over: its producer's InitProducerId aborts
// what the dead one left open, the group hands it the partitions once the
// dead member is evicted, and it resumes from the offsets committed in the
// dead one's transactions. A read_committed reader sees exactly one output
// per input.
func TestTxnRouterSIGKILL(t *testing.T) {
	t.Parallel()
	c, r, rd := startTxnRig(t, 4, 4000)
	ids := r.inputIDs()
	const txnID = "txn-crash"

	cmd, _ := startTxnChild(t, c, r, txnID)
	kafkatest.WaitFor(t, 90*time.Second, "the child's first outputs", func() bool { return rd.seen(ids) >= txnChildStopAt })
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	before := rd.seen(ids)
	t.Logf("killed the child with %d of %d inputs' outputs visible", before, len(ids))
	require.Less(t, before, len(ids), "the child finished before it was killed: nothing to check")

	sub, pub := r.subscriber(t, txnID, func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		if c.Embedded() {
			shortSessions(cfg.OverwriteSaramaConfig)
		}
	})
	var att attempts
	runRouter(t, r, sub, pub, transform(&att, 3*time.Millisecond))
	r.requireExactlyOnce(t, rd, ids, 120*time.Second, 60*time.Second)
	t.Logf("survivor: %+v", pub.Stats())
}

// startTxnChild starts a transactional router process on the rig's topics
// with transactional id txnID. Its last reported transaction counts are
// returned by stats.
func startTxnChild(t *testing.T, c *kafkatest.Cluster, r *txnRig, txnID string) (cmd *exec.Cmd, stats func() (committed, aborted uint64)) {
	t.Helper()
	return startTxnChildBalanced(t, c, r, txnID, false)
}

// startTxnChildBalanced is startTxnChild with cooperative-sticky balancing
// when coop is set.
func startTxnChildBalanced(t *testing.T, c *kafkatest.Cluster, r *txnRig, txnID string, coop bool) (cmd *exec.Cmd, stats func() (committed, aborted uint64)) {
	t.Helper()
	cmd = exec.Command(os.Args[0], "-test.run=^TestHelperTxnRouterProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envTxnChild+"=1",
		kafkatest.EnvBrokers+"="+strings.Join(c.Brokers(), ","),
		envTxnChildIn+"="+r.in,
		envTxnChildOut+"="+r.out,
		envTxnChildGrp+"="+r.group,
		envTxnChildID+"="+txnID,
	)
	if coop {
		cmd.Env = append(cmd.Env, envTxnChildCoop+"=1")
	}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	var mu sync.Mutex
	var committed, aborted uint64
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var cm, ab uint64
			if _, err := fmt.Sscanf(sc.Text(), "STATS %d %d", &cm, &ab); err == nil {
				mu.Lock()
				committed, aborted = cm, ab
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = stdin.Close()
		if t.Failed() {
			t.Logf("child's stderr:\n%s", stderr.String())
		}
	})
	return cmd, func() (uint64, uint64) {
		mu.Lock()
		defer mu.Unlock()
		return committed, aborted
	}
}

// A zombie: a router process is stopped (SIGSTOP) while it owns the
// partitions, the group evicts it and hands them to a second member (with
// a transactional id of its own, so that nothing fences the zombie's
// producer), and the zombie is let go again (SIGCONT) with acked records
// and open work. Its next transactions carry its old generation and member
// id: the coordinator rejects their offsets (KIP-447) and they abort, so a
// read_committed reader still sees exactly one output per input.
func TestTxnZombieFencedByGeneration(t *testing.T) {
	t.Parallel()
	txnZombieFencedByGeneration(t, false)
}

// TestTxnZombieFencedByGenerationCooperative is
// TestTxnZombieFencedByGeneration with cooperative-sticky balancing, where a
// session outlives rebalances and its transactions take the generation it
// has when they commit: the zombie's session still has the generation and
// member id the group dropped, and a transaction refused for them is not
// tried again (only one refused for a generation its own session moved
// past is), so it aborts.
func TestTxnZombieFencedByGenerationCooperative(t *testing.T) {
	t.Parallel()
	txnZombieFencedByGeneration(t, true)
}

func txnZombieFencedByGeneration(t *testing.T, coop bool) {
	c, r, rd := startTxnRig(t, 4, 4000)
	ids := r.inputIDs()

	zombie, zombieStats := startTxnChildBalanced(t, c, r, "txn-zombie-old", coop)
	kafkatest.WaitFor(t, 90*time.Second, "the first member's outputs", func() bool { return rd.seen(ids) >= txnChildStopAt })
	require.NoError(t, zombie.Process.Signal(syscall.SIGSTOP))
	stopped := rd.seen(ids)
	t.Logf("stopped the first member with %d of %d inputs' outputs visible", stopped, len(ids))
	require.Less(t, stopped, len(ids), "the first member finished before it was stopped")

	sub, pub := r.subscriber(t, "txn-zombie-new", func(cfg *safeack.SubscriberConfig, _ *safeack.TxnConfig) {
		if c.Embedded() {
			shortSessions(cfg.OverwriteSaramaConfig)
		}
		if coop {
			cooperative(cfg)
		}
	})
	var att attempts
	// The new member holds back its handlers until the zombie is awake
	// again, so that the zombie's transactions race its own.
	awake := make(chan struct{})
	work := transform(&att, 3*time.Millisecond)
	runRouter(t, r, sub, pub, func(msg *message.Message) ([]*message.Message, error) {
		select {
		case <-awake:
		case <-msg.Context().Done():
			return nil, msg.Context().Err()
		}
		return work(msg)
	})
	kafkatest.WaitFor(t, 90*time.Second, "the second member to own every partition", func() bool {
		return len(sub.Stats()) == r.parts
	})
	_, abortedBefore := zombieStats()
	require.NoError(t, zombie.Process.Signal(syscall.SIGCONT))
	kafkatest.WaitFor(t, 60*time.Second, "an aborted transaction of the zombie", func() bool {
		_, ab := zombieStats()
		return ab > abortedBefore
	})
	close(awake)
	r.requireExactlyOnce(t, rd, ids, 120*time.Second, 60*time.Second)
	zc, za := zombieStats()
	t.Logf("zombie: %d committed, %d aborted; second member: %+v", zc, za, pub.Stats())
}
