//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// drainTimeout bounds the wait, once the producer stopped, for every record
// to be acked and committed.
func drainTimeout() time.Duration {
	if testing.Short() {
		return 2 * time.Minute
	}
	return 4 * time.Minute
}

const stopTimeout = 30 * time.Second

// leaveAll closes the members at once and waits for them.
func leaveAll(ms []*member) {
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() { defer wg.Done(); m.leave() }()
	}
	wg.Wait()
}

// TestCrashLoop runs two consumer processes while a producer writes, and
// SIGKILLs one of them at a random moment (0.5 to 3 s apart) -chaos.kills
// times, starting a replacement after each kill. A final process then joins,
// the survivors stop gracefully, and the final one drains the topic. It
// runs with the consumers at OffsetOldest and at OffsetNewest (see
// scenario.begin).
func TestCrashLoop(t *testing.T) {
	t.Parallel()
	sideBySide(t, crashLoop)
}

// sideBySide runs run once for each setting of initials, as subtests
// named after it, at the same time. They share their parent's place among
// the -parallel tests rather than take one each: the scenarios mostly wait
// on the group protocol, and each pair then takes about as long as one
// scenario did when there were no OffsetNewest variants.
func sideBySide(t *testing.T, run func(t *testing.T, initial int64)) {
	var wg sync.WaitGroup
	for _, initial := range initials {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(initialName(initial), func(t *testing.T) { run(t, initial) })
		}()
	}
	wg.Wait()
}

func crashLoop(t *testing.T, initial int64) {
	sc := newScenario(t, "crash-loop"+initialSuffix(initial), scenarioOpts{partitions: 6, initial: initial})
	// live is shared with the group watch, which may replace one of them.
	live := &crew[*child]{}
	sc.begin(300, func() {
		live.add(sc.spawn(), sc.spawn())
		sc.fig.MemberChanges += 2
	}, live.owned)
	watch := sc.watchGroup(sc.groupStallLimit(false), live.owned, live.replacer(sc.spawnE, func(ch *child) { ch.kill() }, "SIGKILLed"))
	for i := range crashes() {
		gap := sc.between(500*time.Millisecond, 3*time.Second)
		if i == 0 && initial == sarama.OffsetNewest {
			// While the first records are held (see scenario.begin).
			gap = sc.between(200*time.Millisecond, holdFirst-500*time.Millisecond)
		}
		time.Sleep(gap)
		if err := live.replace(sc.rng.IntN(live.len()), sc.spawnE, func(ch *child) { ch.kill() }); err != nil {
			t.Fatal(err)
		}
		sc.fig.Crashes++
		sc.fig.MemberChanges += 2
	}
	sc.endChurn()
	survivors := live.take()
	live.add(sc.spawn())
	sc.fig.MemberChanges++
	time.Sleep(time.Second)
	for _, ch := range survivors {
		if err := ch.stop(stopTimeout); err != nil {
			t.Error(err)
		}
		sc.fig.MemberChanges++
	}
	sc.finish(drainTimeout(), func() {
		watch.stop()
		for _, ch := range live.take() {
			if err := ch.stop(stopTimeout); err != nil {
				t.Error(err)
			}
		}
	})
}

// owner is a consumer whose partitions the group watch can see.
type owner interface {
	*child | *member
	ownedNow() []int32
}

// crew is a scenario's live consumers, shared between the scenario and its
// group watch.
type crew[T owner] struct {
	mu   sync.Mutex
	list []T
}

func (c *crew[T]) add(xs ...T) {
	c.mu.Lock()
	c.list = append(c.list, xs...)
	c.mu.Unlock()
}

func (c *crew[T]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.list)
}

func (c *crew[T]) all() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.list)
}

// take removes every consumer from the crew and returns them.
func (c *crew[T]) take() []T {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.list
	c.list = nil
	return out
}

// remove removes consumer j and returns it.
func (c *crew[T]) remove(j int) T {
	c.mu.Lock()
	defer c.mu.Unlock()
	x := c.list[j]
	c.list = slices.Delete(c.list, j, j+1)
	return x
}

// owned returns the partitions each consumer owns.
func (c *crew[T]) owned() [][]int32 {
	var out [][]int32
	for _, x := range c.all() {
		out = append(out, x.ownedNow())
	}
	return out
}

// replace ends consumer j with end and puts a new one from start in its
// place.
func (c *crew[T]) replace(j int, start func() (T, error), end func(T)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	end(c.list[j])
	x, err := start()
	if err != nil {
		c.list = slices.Delete(c.list, j, j+1)
		return err
	}
	c.list[j] = x
	return nil
}

// replacer returns the group watch's restart: it replaces a consumer that
// owns nothing (one the broker may have left waiting), or else the first.
func (c *crew[T]) replacer(start func() (T, error), end func(T), how string) func() (string, error) {
	return func() (string, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if len(c.list) == 0 {
			x, err := start()
			if err != nil {
				return "", err
			}
			c.list = append(c.list, x)
			return "no consumer was live: started one", nil
		}
		j := 0
		for i, x := range c.list {
			if len(x.ownedNow()) == 0 {
				j = i
				break
			}
		}
		old := c.list[j]
		what := fmt.Sprintf("consumer %s (owning %v) %s and replaced", consumerName(old), old.ownedNow(), how)
		end(old)
		x, err := start()
		if err != nil {
			c.list = slices.Delete(c.list, j, j+1)
			return what, err
		}
		c.list[j] = x
		return what + " by " + consumerName(x), nil
	}
}

func consumerName[T owner](x T) string {
	switch v := any(x).(type) {
	case *child:
		return fmt.Sprintf("process %d", v.id)
	case *member:
		return fmt.Sprintf("member %d", v.id)
	}
	return "?"
}

// TestRebalanceStorm runs in-process members of one group while a producer
// writes; every 150 to 500 ms a member joins or one leaves (between one and
// five of them), with eager and with cooperative-sticky balancing, each
// with the members at OffsetOldest and at OffsetNewest (see
// scenario.begin). On the consumer protocol the coordinator's assignor
// balances, incrementally: one variant (subtest "consumer"), at both
// offsets.
func TestRebalanceStorm(t *testing.T) {
	t.Parallel()
	if protocol == safeack.GroupProtocolConsumer {
		t.Run("consumer", func(t *testing.T) {
			sideBySide(t, func(t *testing.T, initial int64) {
				storm(t, "rebalance-storm"+initialSuffix(initial), false, initial)
			})
		})
		return
	}
	kafkatest.EagerAndCooperative(t, func(t *testing.T, coop bool) {
		sideBySide(t, func(t *testing.T, initial int64) {
			storm(t, "rebalance-storm-"+kafkatest.RebalanceName(coop)+initialSuffix(initial), coop, initial)
		})
	})
}

func storm(t *testing.T, name string, coop bool, initial int64) {
	sc := newScenario(t, name, scenarioOpts{partitions: 8, coop: coop, initial: initial})
	live := &crew[*member]{}
	sc.begin(300, func() {
		live.add(sc.join(), sc.join())
		sc.fig.MemberChanges += 2
	}, live.owned)
	// A member replaced by the watch leaves in the background (it may be
	// waiting on the broker); the scenario's cleanup waits for it.
	watch := sc.watchGroup(sc.groupStallLimit(false), live.owned, live.replacer(sc.joinE, func(m *member) { go m.leave() }, "asked to leave"))
	var leaving sync.WaitGroup
	for deadline := time.Now().Add(churn()); time.Now().Before(deadline); {
		time.Sleep(sc.between(150*time.Millisecond, 500*time.Millisecond))
		if n := live.len(); n <= 1 || n < 5 && sc.rng.IntN(2) == 0 {
			live.add(sc.join())
		} else {
			m := live.remove(sc.rng.IntN(n))
			leaving.Add(1)
			go func() { defer leaving.Done(); m.leave() }()
		}
		sc.fig.MemberChanges++
	}
	sc.endChurn()
	leaving.Wait()
	sc.finish(drainTimeout(), func() { watch.stop(); leaveAll(live.take()) })
}

// TestBrokerFaults runs three in-process members on a three-broker embedded
// cluster while, every 100 to 400 ms, one fault is injected: failed
// OffsetCommits (coordinator errors, unknown errors, rebalance in progress;
// on the consumer protocol STALE_MEMBER_EPOCH instead of the last),
// timed-out ones (REQUEST_TIMED_OUT after the commit was applied), stalled
// ones (the broker stops 0.1 to 0.8 s on one), coordinator moves, partition
// leader moves, failed fetches, a heartbeat answered REBALANCE_IN_PROGRESS,
// a failed JoinGroup (on the consumer protocol: ConsumerGroupHeartbeats
// failed with a coordinator error, then with a retriable one).
func TestBrokerFaults(t *testing.T) {
	t.Parallel()
	if os.Getenv(kafkatest.EnvBrokers) != "" {
		t.Skip("fault injection needs the embedded broker")
	}
	sc := newScenario(t, "broker-faults", scenarioOpts{
		partitions: 6,
		cluster:    []kafkatest.Option{kafkatest.WithBrokers(3)},
	})
	inj := &injector{sc: sc, kf: sc.c.Kfake(), applied: map[string]int{}}
	sc.startProducer(300)
	live := []*member{sc.join(), sc.join(), sc.join()}
	sc.fig.MemberChanges += 3
	for deadline := time.Now().Add(churn()); time.Now().Before(deadline); {
		time.Sleep(sc.between(100*time.Millisecond, 400*time.Millisecond))
		inj.inject()
	}
	inj.stop()
	sc.endChurn()
	sc.fig.Faults, sc.fig.FaultDetail = inj.count()
	sc.finish(drainTimeout(), func() { leaveAll(live) })
}

// injector injects broker faults into the embedded cluster.
type injector struct {
	sc      *scenario
	kf      *kfake.Cluster
	mu      sync.Mutex
	handles []labeled
	applied map[string]int // faults applied directly (moves) or counted by their control
	delays  atomic.Int64
}

type labeled struct {
	kind string
	h    *kfake.FaultHandle
}

func (in *injector) fault(kind string, f kfake.Fault) {
	h := in.kf.Fault(f)
	in.mu.Lock()
	in.handles = append(in.handles, labeled{kind, h})
	in.mu.Unlock()
}

func pick[T any](in *injector, xs ...T) T { return xs[in.sc.rng.IntN(len(xs))] }

func (in *injector) inject() {
	sc := in.sc
	consumer := protocol == safeack.GroupProtocolConsumer
	switch sc.rng.IntN(9) {
	case 0, 1:
		// A classic group answers a commit of a group in a rebalance
		// REBALANCE_IN_PROGRESS; a consumer group one of a member whose
		// epoch moved on STALE_MEMBER_EPOCH: resent with the new epoch
		// while the member owns the partition.
		refused := kerr.RebalanceInProgress
		if consumer {
			refused = kerr.StaleMemberEpoch
		}
		in.fault("commit error", kfake.Fault{
			Keys:  []kmsg.Key{kmsg.OffsetCommit},
			Err:   pick(in, kerr.NotCoordinator, kerr.CoordinatorNotAvailable, kerr.CoordinatorLoadInProgress, kerr.UnknownServerError, refused),
			Count: 1 + sc.rng.IntN(3),
		})
	case 2:
		// Applied, then answered as timed out: the client retries a commit
		// the broker already holds.
		in.fault("commit timed out", kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.RequestTimedOut, Count: 1 + sc.rng.IntN(3)})
	case 3:
		// The broker stalls on the next OffsetCommit: every request
		// waits, then the commit is handled normally. (kfake's
		// SleepControl would stall the one connection only, but it has a
		// data race the race detector reports.)
		d := sc.between(100*time.Millisecond, 800*time.Millisecond)
		kf := in.kf
		var used atomic.Bool
		kf.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
			kf.DropControl()
			if !used.Swap(true) {
				time.Sleep(d)
				in.delays.Add(1)
			}
			return nil, nil, false
		})
	case 4:
		in.kf.RehashCoordinators()
		in.applied["coordinator move"]++
	case 5:
		p := sc.rng.Int32N(int32(sc.partitions))
		if err := in.kf.MoveTopicPartition(sc.topic, p, sc.rng.Int32N(3)); err == nil {
			in.applied["leader move"]++
		}
	case 6:
		in.fault("fetch error", kfake.Fault{
			Keys:       []kmsg.Key{kmsg.Fetch},
			Topic:      sc.topic,
			Partitions: []int32{sc.rng.Int32N(int32(sc.partitions))},
			Err:        pick(in, kerr.NotLeaderForPartition, kerr.UnknownServerError, kerr.KafkaStorageError),
			Count:      1 + sc.rng.IntN(5),
		})
	case 7:
		if consumer {
			// The member finds the coordinator again and heartbeats
			// on: its epoch and assignment stay.
			in.fault("heartbeat error", kfake.Fault{
				Keys:     []kmsg.Key{kmsg.ConsumerGroupHeartbeat},
				TopLevel: true,
				Err:      pick(in, kerr.NotCoordinator, kerr.CoordinatorNotAvailable, kerr.CoordinatorLoadInProgress),
			})
			return
		}
		in.fault("heartbeat error", kfake.Fault{Keys: []kmsg.Key{kmsg.Heartbeat}, TopLevel: true, Err: kerr.RebalanceInProgress})
	case 8:
		if consumer {
			in.fault("heartbeat error", kfake.Fault{
				Keys:     []kmsg.Key{kmsg.ConsumerGroupHeartbeat},
				TopLevel: true,
				Err:      pick(in, kerr.RequestTimedOut, kerr.UnknownServerError),
				Count:    1 + sc.rng.IntN(2),
			})
			return
		}
		in.fault("join error", kfake.Fault{
			Keys:     []kmsg.Key{kmsg.JoinGroup},
			TopLevel: true,
			Err:      pick(in, kerr.CoordinatorLoadInProgress, kerr.CoordinatorNotAvailable, kerr.NotCoordinator),
		})
	}
}

// stop removes the faults not yet used up.
func (in *injector) stop() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, l := range in.handles {
		l.h.Remove()
	}
}

// count returns the faults the broker applied, in total and by kind.
func (in *injector) count() (int, string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	by := make(map[string]int)
	for k, n := range in.applied {
		by[k] += n
	}
	for _, l := range in.handles {
		by[l.kind] += l.h.Hits()
	}
	by["commit stalled"] += int(in.delays.Load())
	total := 0
	kinds := make([]string, 0, len(by))
	for k, n := range by {
		total += n
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var parts []string
	for _, k := range kinds {
		if by[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
		}
	}
	return total, strings.Join(parts, ", ")
}

// TestBrokerRestart restarts the real broker (keeping its data) while three
// in-process members consume and the producer writes: once with -short,
// three times otherwise. Each restart's stall (from the broker's return
// until every partition acked a record produced after it) is in the
// figures. It is not parallel: the other scenarios wait.
func TestBrokerRestart(t *testing.T) {
	if os.Getenv(kafkatest.EnvBrokers) == "" {
		t.Skip("restarts a real broker: set " + kafkatest.EnvBrokers)
	}
	restart := os.Getenv(envRestart)
	if restart == "" {
		t.Skip("set " + envRestart + " to a command that restarts the broker keeping its data (scripts/ci-kafka-bounce.sh)")
	}
	sc := newScenario(t, "broker-restart", scenarioOpts{partitions: 6})
	sc.startProducer(300)
	live := []*member{sc.join(), sc.join(), sc.join()}
	sc.fig.MemberChanges += 3
	restarts := 3
	if testing.Short() {
		restarts = 1
	}
	gap := churn() / time.Duration(restarts+1)
	var down []string
	for i := range restarts {
		time.Sleep(gap)
		t0 := time.Now()
		if out, err := runRestart(restart); err != nil {
			t.Fatalf("restart %d (%s): %v\n%s", i+1, restart, err, out)
		}
		took := time.Since(t0)
		// Its stall counts from the broker's return: until every
		// partition acked a record produced after it.
		f := sc.failure(fmt.Sprintf("broker restart %d (down %v; stall from its return)", i+1, took.Round(100*time.Millisecond)), 0, nil)
		// The churn goes on once records flow again to every
		// partition (the producer needs a few seconds after the
		// broker's return), so that the members consume records
		// produced after the restart before it ends.
		if !waitCond(time.Minute, func() bool {
			now := sc.prod.confirmedNow()
			for p := range now {
				if now[p] <= f.after[p] {
					return false
				}
			}
			return true
		}) {
			t.Errorf("the producer wrote to some partitions nothing within 1m of restart %d's end: confirmed %v, before %v", i+1, sc.prod.confirmedNow(), f.after)
		}
		sc.note("records produced to every partition after restart %d", i+1)
		t.Logf("broker restart %d took %v", i+1, took.Round(100*time.Millisecond))
		down = append(down, fmt.Sprintf("%.0fs", took.Seconds()))
		sc.fig.Faults++
	}
	sc.fig.FaultDetail = "broker restarts, " + strings.Join(down, "/") + " each"
	time.Sleep(gap)
	sc.endChurn()
	sc.finish(drainTimeout(), func() { leaveAll(live) })
}

// runRestart runs the restart command with its output in a file, not a
// pipe: a broker started by it must not hold the test's pipe open.
func runRestart(command string) (string, error) {
	f, err := os.CreateTemp("", "chaos-restart-*.log")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", command)
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	out, _ := os.ReadFile(f.Name())
	return string(out), err
}
