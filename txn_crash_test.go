package safeack_test

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
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
	envTxnChild    = "SAFEACK_TEST_TXN_CHILD" // "1" in the child
	envTxnChildIn  = "SAFEACK_TEST_TXN_IN"
	envTxnChildOut = "SAFEACK_TEST_TXN_OUT"
	envTxnChildGrp = "SAFEACK_TEST_TXN_GROUP"
	envTxnChildID  = "SAFEACK_TEST_TXN_ID"
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
	})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	var att attempts
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	router.AddMiddleware(pub.Middleware)
	router.AddHandler("transform", r.in, sub, r.out, pub, transform(&att, 3*time.Millisecond))
	_ = router.Run(context.Background())
	select {} // killed by the parent
}

// shortSessions lets the embedded broker evict a killed member quickly (but
// not so quickly that a loaded machine expels a live one).
func shortSessions(sc *sarama.Config) {
	sc.Consumer.Group.Session.Timeout = kafkatest.EmbeddedSessionTimeout
	sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	sc.Consumer.Group.Rebalance.Timeout = kafkatest.EmbeddedSessionTimeout
}

// A transactional router process is SIGKILLed mid-stream, with handlers
// running and transactions open or committing. A new instance with the
// same transactional id takes over: its producer's InitProducerId aborts
// what the dead one left open, the group hands it the partitions once the
// dead member is evicted, and it resumes from the offsets committed in the
// dead one's transactions. A read_committed reader sees exactly one output
// per input.
func TestTxnRouterSIGKILL(t *testing.T) {
	c := kafkatest.Start(t)
	r := newTxnRig(t, c, 4, 4000)
	rd := readOutputs(t, c, r.out, r.parts, sarama.ReadCommitted)
	ids := r.inputIDs()
	const txnID = "txn-crash"

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperTxnRouterProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envTxnChild+"=1",
		kafkatest.EnvBrokers+"="+strings.Join(c.Brokers(), ","),
		envTxnChildIn+"="+r.in,
		envTxnChildOut+"="+r.out,
		envTxnChildGrp+"="+r.group,
		envTxnChildID+"="+txnID,
	)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		_ = stdin.Close()
	})
	kafkatest.WaitFor(t, 90*time.Second, "the child's first outputs", func() bool { return rd.seen(ids) >= 500 })
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed = true
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
	rd.waitAll(t, ids, 120*time.Second)
	r.waitCommittedAll(t, 60*time.Second)
	rd.complete(t, c, r.out, r.parts)
	if t.Failed() {
		t.Logf("child's stderr:\n%s", stderr.String())
	}
	rd.checkExactlyOnce(t, ids)
	t.Logf("survivor: %+v", pub.Stats())
}
