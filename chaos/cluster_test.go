//go:build chaos

package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/safeack/safeack/internal/kafkatest"
)

// The TestCluster scenarios fail the nodes of a three-node Kafka cluster
// (scripts/kafka-cluster.sh: replication factor 3, min.insync.replicas 2)
// under a running group: the leader of busy partitions SIGKILLed, the
// group coordinator's node SIGKILLed with an OffsetCommit in flight, a node
// hung (SIGSTOP) longer than the session timeout, a rolling restart, and
// consumer processes SIGKILLed together with a node. They need
// SAFEACK_CHAOS_CLUSTER (the cluster's control script, DIR/ctl) and
// SAFEACK_KAFKA_BROKERS pointing at the same cluster, and are skipped
// otherwise. They are not parallel: each has the cluster to itself (go test
// runs them before the parallel scenarios).
//
// Each failure is timed: its stall is the time from the failure until every
// partition it affected (those its node led; every partition when the node
// coordinated the group or consumers died with it) acked a record produced
// after it. That includes the producer's own recovery: a record must be
// written before it can be handled.

// clusterCtl drives the cluster through its control script.
type clusterCtl struct {
	path   string
	client sarama.Client // metadata: leaders, coordinator, ISRs
}

type kafkaNode struct {
	ID    int32
	State string // running, paused or down
	PID   int
	Addr  string
}

// requireCluster skips t without a cluster; otherwise it checks that
// SAFEACK_KAFKA_BROKERS is the controlled cluster, heals it (every node
// running) and waits until it is healthy, and heals it again when t ends.
func requireCluster(t *testing.T) *clusterCtl {
	t.Helper()
	path := os.Getenv(envCluster)
	if path == "" {
		t.Skipf("needs a three-node Kafka cluster whose nodes it can kill: eval \"export $(scripts/kafka-cluster.sh start)\" sets %s and %s", kafkatest.EnvBrokers, envCluster)
	}
	brokers := os.Getenv(kafkatest.EnvBrokers)
	if brokers == "" {
		t.Fatalf("%s=%s is set but %s is not: point both at the same cluster (scripts/kafka-cluster.sh env)", envCluster, path, kafkatest.EnvBrokers)
	}
	k := &clusterCtl{path: path}
	nodes, err := k.nodes()
	if err != nil {
		t.Fatalf("%s: %v", envCluster, err)
	}
	if len(nodes) != 3 {
		t.Fatalf("%s nodes: %d nodes, want 3", path, len(nodes))
	}
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" && !slices.Contains(addrs, b) {
			t.Fatalf("%s names %s, which is not a node of the cluster %s controls (%v)", kafkatest.EnvBrokers, b, envCluster, addrs)
		}
	}
	cfg := sarama.NewConfig()
	cfg.Version = kafkatest.DefaultVersion
	cfg.ClientID = "chaos-cluster-ctl"
	// Short timeouts: a paused node must not hold a metadata request.
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 5 * time.Second
	cfg.Net.WriteTimeout = 5 * time.Second
	cfg.Metadata.Retry.Max = 2
	cfg.Metadata.Retry.Backoff = 200 * time.Millisecond
	cfg.Metadata.RefreshFrequency = 0
	if !waitCond(time.Minute, func() bool {
		k.client, err = sarama.NewClient(addrs, cfg)
		return err == nil
	}) {
		t.Fatalf("cluster client for %v: %v", addrs, err)
	}
	t.Cleanup(func() { _ = k.client.Close() })
	heal := func() {
		if err := k.heal(); err != nil {
			t.Errorf("healing the cluster: %v", err)
			return
		}
		if err := k.waitHealthy(3*time.Minute, ""); err != nil {
			t.Errorf("the cluster did not recover: %v", err)
		}
	}
	heal()
	if t.Failed() {
		t.FailNow()
	}
	t.Cleanup(heal)
	return k
}

// nodeStartTimeout is how long a node may take to start again. The
// script's default (SAFEACK_KAFKA_START_TIMEOUT, 90 s) is for a machine at
// rest; a node restarting on two cores shared with the test, the other two
// nodes and other work has been seen to take longer.
const nodeStartTimeout = 5 * time.Minute

// run runs the control script with args, its output in a file rather than
// a pipe (a node it starts must not hold the test's pipe open).
func (k *clusterCtl) run(timeout time.Duration, args ...string) (string, error) {
	f, err := os.CreateTemp("", "chaos-cluster-*.log")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = os.Environ()
	if v, err := strconv.Atoi(os.Getenv("SAFEACK_KAFKA_START_TIMEOUT")); err != nil || time.Duration(v)*time.Second < nodeStartTimeout {
		cmd.Env = append(cmd.Env, fmt.Sprintf("SAFEACK_KAFKA_START_TIMEOUT=%d", int(nodeStartTimeout.Seconds())))
	}
	err = cmd.Run()
	out, _ := os.ReadFile(f.Name())
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v\n%s", k.path, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// nodes asks the control script for the nodes: ID STATE PID ADDR lines.
func (k *clusterCtl) nodes() ([]kafkaNode, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, k.path, "nodes").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return nil, fmt.Errorf("%s nodes: %v %s", k.path, err, stderr)
	}
	var ns []kafkaNode
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			return nil, fmt.Errorf("%s nodes: unexpected line %q", k.path, sc.Text())
		}
		id, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s nodes: %q: %v", k.path, sc.Text(), err)
		}
		n := kafkaNode{ID: int32(id), State: f[1], Addr: f[3]}
		if f[2] != "-" {
			if n.PID, err = strconv.Atoi(f[2]); err != nil {
				return nil, fmt.Errorf("%s nodes: %q: %v", k.path, sc.Text(), err)
			}
		}
		ns = append(ns, n)
	}
	return ns, nil
}

func (k *clusterCtl) node(id int32) (kafkaNode, error) {
	ns, err := k.nodes()
	if err != nil {
		return kafkaNode{}, err
	}
	for _, n := range ns {
		if n.ID == id {
			return n, nil
		}
	}
	return kafkaNode{}, fmt.Errorf("no node %d", id)
}

// signal sends sig to node id's process directly (no script in between:
// the moment matters), which must be running.
func (k *clusterCtl) signal(n kafkaNode, sig syscall.Signal) error {
	if n.PID <= 0 || n.State == "down" {
		return fmt.Errorf("node %d is down", n.ID)
	}
	return syscall.Kill(n.PID, sig)
}

// waitState waits until node id is in state.
func (k *clusterCtl) waitState(id int32, state string, timeout time.Duration) error {
	var last kafkaNode
	var err error
	if waitCond(timeout, func() bool {
		last, err = k.node(id)
		return err == nil && last.State == state
	}) {
		return nil
	}
	return fmt.Errorf("node %d is %q, not %q, after %v (%v)", id, last.State, state, timeout, err)
}

// start starts node id again on its data (the script waits until it
// answers).
func (k *clusterCtl) start(id int32) error {
	_, err := k.run(nodeStartTimeout+time.Minute, "node", strconv.Itoa(int(id)), "start")
	return err
}

// stop stops node id with SIGTERM: a controlled shutdown.
func (k *clusterCtl) stop(id int32) error {
	_, err := k.run(2*time.Minute, "node", strconv.Itoa(int(id)), "stop")
	return err
}

// heal resumes paused nodes and starts stopped ones.
func (k *clusterCtl) heal() error {
	ns, err := k.nodes()
	if err != nil {
		return err
	}
	for _, n := range ns {
		switch n.State {
		case "paused":
			if err := k.signal(n, syscall.SIGCONT); err != nil {
				return err
			}
		case "down":
			if err := k.start(n.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitHealthy waits until every node runs, the cluster's metadata lists
// all three brokers, and every partition of topic (when not "") and of the
// offsets topic (once it exists) has a leader and all three replicas in
// sync: a cluster that can lose any one node again.
func (k *clusterCtl) waitHealthy(timeout time.Duration, topic string) error {
	var why string
	if waitCond(timeout, func() bool {
		why = k.unhealthy(topic)
		return why == ""
	}) {
		return nil
	}
	return fmt.Errorf("not healthy within %v: %s", timeout, why)
}

func (k *clusterCtl) unhealthy(topic string) string {
	ns, err := k.nodes()
	if err != nil {
		return err.Error()
	}
	for _, n := range ns {
		if n.State != "running" {
			return fmt.Sprintf("node %d is %s", n.ID, n.State)
		}
	}
	if err := k.client.RefreshMetadata(); err != nil {
		return "metadata: " + err.Error()
	}
	if b := k.client.Brokers(); len(b) != len(ns) {
		return fmt.Sprintf("the metadata lists %d brokers", len(b))
	}
	topics := []string{}
	if topic != "" {
		topics = append(topics, topic)
	}
	if all, err := k.client.Topics(); err == nil && slices.Contains(all, "__consumer_offsets") {
		topics = append(topics, "__consumer_offsets")
	}
	for _, tp := range topics {
		ps, err := k.client.Partitions(tp)
		if err != nil {
			return fmt.Sprintf("%s: %v", tp, err)
		}
		for _, p := range ps {
			if _, err := k.client.Leader(tp, p); err != nil {
				return fmt.Sprintf("%s/%d: no leader (%v)", tp, p, err)
			}
			isr, err := k.client.InSyncReplicas(tp, p)
			if err != nil || len(isr) != len(ns) {
				return fmt.Sprintf("%s/%d: in-sync replicas %v (%v)", tp, p, isr, err)
			}
		}
	}
	return ""
}

// leaders returns the leader of every partition of topic, by node id.
func (k *clusterCtl) leaders(topic string) (map[int32]int32, error) {
	if err := k.client.RefreshMetadata(topic); err != nil {
		return nil, err
	}
	ps, err := k.client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int32, len(ps))
	for _, p := range ps {
		b, err := k.client.Leader(topic, p)
		if err != nil {
			return nil, fmt.Errorf("leader of %s/%d: %w", topic, p, err)
		}
		out[p] = b.ID()
	}
	return out, nil
}

// coordinator returns the node id of the group's coordinator.
func (k *clusterCtl) coordinator(group string) (int32, error) {
	if err := k.client.RefreshCoordinator(group); err != nil {
		return 0, err
	}
	b, err := k.client.Coordinator(group)
	if err != nil {
		return 0, err
	}
	return b.ID(), nil
}

// led returns the partitions node leads, in order.
func led(leaders map[int32]int32, node int32) []int32 {
	var out []int32
	for p, l := range leaders {
		if l == node {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// busiest returns the node leading the most partitions, other than avoid
// when another leads any.
func busiest(leaders map[int32]int32, avoid int32) int32 {
	count := map[int32]int{}
	for _, l := range leaders {
		count[l]++
	}
	best, bestN := int32(-1), -1
	for n, c := range count {
		if n == avoid {
			continue
		}
		if c > bestN || c == bestN && n < best {
			best, bestN = n, c
		}
	}
	if best < 0 {
		return avoid
	}
	return best
}

// ------------------------------------------------------------ failures --

// failover is one broker failure the scenario caused, for its stall.
type failover struct {
	what     string
	node     int32
	at       time.Time
	affected []int32 // nil: every partition
	// after is, per partition, the producer's last confirmed offset when
	// the failure came: the records above it were produced after it.
	after []int64
}

// failure records a broker failure the caller is about to cause (call it
// just before the signal): what it is and which partitions it affects.
func (sc *scenario) failure(what string, node int32, affected []int32) *failover {
	f := &failover{what: what, node: node, at: time.Now(), affected: affected, after: sc.prod.confirmedNow()}
	sc.mu.Lock()
	sc.failovers = append(sc.failovers, f)
	sc.mu.Unlock()
	sc.changed()
	sc.note("failure: %s", what)
	return f
}

// stalls measures each failure's stall (see the file comment) and logs
// the detail; -1 for a failure after which nothing was produced on the
// partitions it affected.
func (sc *scenario) stalls(end map[int32]int64) []time.Duration {
	sc.mu.Lock()
	fs := slices.Clone(sc.failovers)
	sc.mu.Unlock()
	var out []time.Duration
	for i, f := range fs {
		parts := f.affected
		if parts == nil {
			for p := range int32(sc.partitions) {
				parts = append(parts, p)
			}
		}
		worst, worstP := time.Duration(-1), int32(-1)
		var detail []string
		for _, p := range parts {
			at, ok := sc.led.firstAckAbove(p, f.after[p], end[p], f.at)
			if !ok {
				detail = append(detail, fmt.Sprintf("%d: -", p))
				continue
			}
			d := at.Sub(f.at)
			detail = append(detail, fmt.Sprintf("%d: %.1fs", p, d.Seconds()))
			if d > worst {
				worst, worstP = d, p
			}
		}
		out = append(out, worst)
		sc.t.Logf("%s: failure %d, %s: stall %.1fs (partition %d last; per partition %s)",
			sc.name, i+1, f.what, worst.Seconds(), worstP, strings.Join(detail, ", "))
	}
	return out
}

// firstAckAbove returns the first ack after t of a record of partition p
// at an offset in (above, end).
func (l *ledger) firstAckAbove(p int32, above, end int64, t time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first time.Time
	for o := above + 1; o < end; o++ {
		if a, ok := l.firstAck[po{p, o}]; ok && a.After(t) && (first.IsZero() || a.Before(first)) {
			first = a
		}
	}
	return first, !first.IsZero()
}

// -------------------------------------------------------- the scenarios --

// clusterRun is one cluster scenario: its cluster, the scenario, the
// group watch and what it needs between failures.
type clusterRun struct {
	t     *testing.T
	k     *clusterCtl
	sc    *scenario
	owned func() [][]int32
	watch *groupWatch
}

// clusterScenario starts a scenario on the cluster: a 6-partition topic
// (replicated three times, the cluster's default) and a producer writing
// 300 records a second.
func clusterScenario(t *testing.T, name string) *clusterRun {
	k := requireCluster(t)
	sc := newScenario(t, name, scenarioOpts{partitions: 6})
	sc.fig.Broker = "kafka, 3 nodes"
	if err := k.waitHealthy(3*time.Minute, sc.topic); err != nil {
		t.Fatal(err)
	}
	sc.startProducer(300)
	return &clusterRun{t: t, k: k, sc: sc}
}

// members starts n in-process members and the group watch over them.
func (r *clusterRun) members(n int) *crew[*member] {
	live := &crew[*member]{}
	for range n {
		live.add(r.sc.join())
	}
	r.sc.fig.MemberChanges += n
	r.owned = live.owned
	r.watch = r.sc.watchGroup(r.sc.groupStallLimit(true), live.owned,
		live.replacer(r.sc.joinE, func(m *member) { go m.leave() }, "asked to leave"))
	return live
}

// processes starts n consumer processes and the group watch over them.
func (r *clusterRun) processes(n int) *crew[*child] {
	live := &crew[*child]{}
	for range n {
		live.add(r.sc.spawn())
	}
	r.sc.fig.MemberChanges += n
	r.owned = live.owned
	r.watch = r.sc.watchGroup(r.sc.groupStallLimit(true), live.owned,
		live.replacer(r.sc.spawnE, func(ch *child) { ch.kill() }, "SIGKILLed"))
	return live
}

// settle waits until the cluster is healthy and the group owns every
// partition, then lets records flow for a moment: the next failure starts
// from a cluster that can lose a node and a group that is consuming.
func (r *clusterRun) settle() {
	t, sc := r.t, r.sc
	t.Helper()
	if err := r.k.waitHealthy(3*time.Minute, sc.topic); err != nil {
		t.Fatal(err)
	}
	if !waitCond(3*time.Minute, func() bool { return len(unownedOf(r.owned(), sc.partitions)) == 0 }) {
		t.Fatalf("%s: the group did not come to own every partition within 3m of the cluster's recovery (it owns %v)", sc.name, r.owned())
	}
	sc.note("settled: cluster healthy, group owns every partition")
	time.Sleep(sc.between(time.Second, 3*time.Second))
}

// settleRoles settles (see settle) and returns who leads each partition of
// the scenario's topic and which node coordinates its group: the roles
// the next failure is chosen by.
func (r *clusterRun) settleRoles() (leaders map[int32]int32, coord int32) {
	r.t.Helper()
	r.settle()
	leaders, err := r.k.leaders(r.sc.topic)
	if err != nil {
		r.t.Fatal(err)
	}
	coord, err = r.k.coordinator(r.sc.group)
	if err != nil {
		r.t.Fatal(err)
	}
	return leaders, coord
}

// affected returns the partitions a failure of node affects: those it
// leads, or nil (every partition) when it coordinates the group.
func affected(leaders map[int32]int32, node, coord int32) []int32 {
	if node == coord {
		return nil
	}
	return led(leaders, node)
}

// describe names a node's roles for the figures' notes.
func describe(leaders map[int32]int32, node, coord int32) string {
	s := fmt.Sprintf("node %d (leader of %v", node, led(leaders, node))
	if node == coord {
		s += ", group coordinator"
	}
	return s + ")"
}

// restartOnceFenced waits, after node was killed, until the process is
// gone and the cluster has fenced the node (its metadata no longer lists
// it: broker.session.timeout.ms, 6 s, after its last heartbeat; its
// partitions are led elsewhere), then up to 2 s more, so that the failover
// happens with the node down however fast it restarts; then it starts the
// node again.
func (r *clusterRun) restartOnceFenced(node int32) {
	t, k := r.t, r.k
	t.Helper()
	if err := k.waitState(node, "down", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	var why string
	if !kafkatest.Poll(time.Minute, 200*time.Millisecond, func() bool {
		if err := k.client.RefreshMetadata(); err != nil {
			why = err.Error()
			return false
		}
		for _, b := range k.client.Brokers() {
			if b.ID() == node {
				why = "still listed"
				return false
			}
		}
		return true
	}) {
		t.Fatalf("node %d was not fenced within 1m of its death (%s)", node, why)
	}
	r.sc.note("node %d fenced", node)
	time.Sleep(r.sc.between(0, 2*time.Second))
	if err := k.start(node); err != nil {
		t.Fatal(err)
	}
	r.sc.note("node %d started again", node)
}

// failures returns how many failures a scenario injects (rounds of the
// rolling restart): -chaos.failures, else short in -short, else long.
func failures(short, long int) int {
	switch {
	case *flagFailures > 0:
		return *flagFailures
	case testing.Short():
		return short
	}
	return long
}

// end stops the watch and the consumers and checks the scenario.
func (r *clusterRun) end(kind string, stop func()) {
	sc := r.sc
	r.settle()
	sc.endChurn()
	sc.mu.Lock()
	n := len(sc.failovers)
	sc.mu.Unlock()
	sc.fig.Faults = n
	sc.fig.FaultDetail = kind
	sc.finish(drainTimeout(), func() {
		r.watch.stop()
		stop()
	})
}

// TestClusterLeaderKill SIGKILLs the node that leads the most partitions
// (not the coordinator's, when another leads any) while three members
// consume, keeps it down until the cluster fenced it (see restartOnceFenced), starts it again and waits until the
// cluster is whole; twice with -short, five times otherwise.
func TestClusterLeaderKill(t *testing.T) {
	r := clusterScenario(t, "cluster-leader-kill")
	sc, k := r.sc, r.k
	live := r.members(3)
	for range failures(2, 5) {
		leaders, coord := r.settleRoles()
		victim := busiest(leaders, coord)
		n, err := k.node(victim)
		if err != nil {
			t.Fatal(err)
		}
		sc.failure("SIGKILL of "+describe(leaders, victim, coord), victim, affected(leaders, victim, coord))
		if err := k.signal(n, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		r.restartOnceFenced(victim)
	}
	r.end("SIGKILL of a partition leader", func() { leaveAll(live.take()) })
}

// TestClusterCoordinatorKill SIGKILLs the node that coordinates the group
// the moment a member has written an OffsetCommit request to it (the
// request is on the wire, its answer not yet read), keeps it down until the cluster
// fenced it and starts it again; twice with -short, four times otherwise. The
// commit may or may not have been applied: either way nothing may be lost
// and no commit may pass an unacked record.
func TestClusterCoordinatorKill(t *testing.T) {
	r := clusterScenario(t, "cluster-coordinator-kill")
	sc, k := r.sc, r.k
	live := r.members(3)
	midCommit := 0
	for range failures(2, 4) {
		leaders, coord := r.settleRoles()
		n, err := k.node(coord)
		if err != nil {
			t.Fatal(err)
		}
		what := "SIGKILL mid-commit of " + describe(leaders, coord, coord)
		var once sync.Once
		fired := make(chan error, 1)
		kill := func(c *sentCommit) {
			once.Do(func() {
				w := what
				if c == nil {
					w = "SIGKILL (no commit seen within 30 s) of " + describe(leaders, coord, coord)
				} else {
					w += fmt.Sprintf(", as a commit of %d partitions (gen %d) was sent", len(c.offsets), c.generation)
				}
				sc.failure(w, coord, nil)
				fired <- k.signal(n, syscall.SIGKILL)
			})
		}
		ms := live.all()
		for _, m := range ms {
			m.tap.armAfterWrite(func(c sentCommit) bool {
				if c.addr != n.Addr || c.group != sc.group {
					return false
				}
				kill(&c)
				return true
			})
		}
		select {
		case err = <-fired:
			midCommit++
		case <-time.After(30 * time.Second):
			kill(nil)
			err = <-fired
		}
		for _, m := range ms {
			m.tap.armAfterWrite(nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		r.restartOnceFenced(coord)
	}
	r.end(fmt.Sprintf("SIGKILL of the coordinator, %d mid-commit", midCommit), func() { leaveAll(live.take()) })
}

// TestClusterBrokerPause hangs a node with SIGSTOP for twice the session
// timeout (at least 12 s: past the cluster's 6 s fencing too), then
// resumes it with SIGCONT: connections to it stay open and unanswered, as
// with a hung machine. The first pause hits the coordinator's node, the
// next the busiest other leader; once with -short, twice otherwise.
func TestClusterBrokerPause(t *testing.T) {
	r := clusterScenario(t, "cluster-broker-pause")
	sc, k := r.sc, r.k
	live := r.members(3)
	pause := max(2*sc.session, 12*time.Second)
	for i := range failures(1, 2) {
		leaders, coord := r.settleRoles()
		victim := coord
		if i%2 == 1 {
			victim = busiest(leaders, coord)
		}
		n, err := k.node(victim)
		if err != nil {
			t.Fatal(err)
		}
		sc.failure(fmt.Sprintf("SIGSTOP for %v of %s", pause, describe(leaders, victim, coord)), victim, affected(leaders, victim, coord))
		if err := k.signal(n, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause)
		if err := k.signal(n, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		sc.note("node %d resumed (SIGCONT)", victim)
	}
	r.end(fmt.Sprintf("SIGSTOP of a node for %v", pause), func() { leaveAll(live.take()) })
}

// TestClusterRollingRestart restarts the three nodes one after the other
// (SIGTERM: a controlled shutdown; then started again on its data), each
// once the cluster is whole again, while three members consume; one round
// with -short, two otherwise.
func TestClusterRollingRestart(t *testing.T) {
	r := clusterScenario(t, "cluster-rolling-restart")
	sc, k := r.sc, r.k
	live := r.members(3)
	for range failures(1, 2) {
		for node := int32(1); node <= 3; node++ {
			leaders, coord := r.settleRoles()
			sc.failure("restart (SIGTERM) of "+describe(leaders, node, coord), node, affected(leaders, node, coord))
			if err := k.stop(node); err != nil {
				t.Fatal(err)
			}
			if err := k.start(node); err != nil {
				t.Fatal(err)
			}
			sc.note("node %d restarted", node)
		}
	}
	r.end("rolling restart of every node (SIGTERM, start)", func() { leaveAll(live.take()) })
}

// TestClusterConsumersAndBroker runs three consumer processes and, at the
// same moment, SIGKILLs a node (the coordinator's, then the busiest other
// leader, in turn) and one or two of the processes; replacements start at
// once, the node once the cluster fenced it; twice with -short, four times otherwise.
func TestClusterConsumersAndBroker(t *testing.T) {
	r := clusterScenario(t, "cluster-consumers-and-broker")
	sc, k := r.sc, r.k
	live := r.processes(3)
	for i := range failures(2, 4) {
		leaders, coord := r.settleRoles()
		victim := coord
		if i%2 == 1 {
			victim = busiest(leaders, coord)
		}
		n, err := k.node(victim)
		if err != nil {
			t.Fatal(err)
		}
		dead := 1 + sc.rng.IntN(2)
		js := sc.rng.Perm(live.len())[:dead]
		sc.failure(fmt.Sprintf("SIGKILL of %s and of %d consumer processes", describe(leaders, victim, coord), dead), victim, nil)
		if err := k.signal(n, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for _, j := range js {
			if err := live.replace(j, sc.spawnE, func(ch *child) { ch.kill() }); err != nil {
				t.Fatal(err)
			}
			sc.fig.Crashes++
			sc.fig.MemberChanges += 2
		}
		r.restartOnceFenced(victim)
	}
	r.end("SIGKILL of a node with consumer processes", func() {
		for _, ch := range live.take() {
			if err := ch.stop(stopTimeout); err != nil {
				t.Error(err)
			}
		}
	})
}
