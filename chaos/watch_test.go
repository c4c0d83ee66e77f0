//go:build chaos

package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/safeack/safeack"
)

// The group watch. A group whose live consumers own no claim on some
// partitions is normal for a while after every change: a killed member
// holds its partitions until its session times out, and a rebalance then
// takes up to the rebalance timeout (and, for a member whose JoinGroup the
// broker never answered, Sarama's Net.ReadTimeout). A group left so past
// all of that is stuck, and the run would otherwise end in a drain timeout
// long after the cause.
//
// (On the consumer protocol a member's partitions move when its session
// times out and, for a revocation, once the member acknowledged it or the
// rebalance timeout passed; the new owner hears of them in its next
// heartbeat.)
//
// The embedded broker (kfake) has been seen doing that: after it dropped
// JoinGroup answers, it left partitions unowned for minutes and started no
// rebalance. The watch reports that as the broker's fault, with what the
// broker says of the group, and restarts a consumer (a JoinGroup starts a
// rebalance), so that the run goes on and is judged on its invariants. A
// real Kafka broker does finish rebalances, so there the same finding is
// also a violation: it points at the consumers (safeack or Sarama), and
// must not be restarted away.

// groupStallLimit is how long partitions may stay unowned after the
// harness's last change before the watch acts: the session timeout, a
// rebalance timeout and a JoinGroup read timeout (newMember: 10 s and
// 15 s), plus as much again for a loaded machine; on a three-node cluster
// add a broker's fencing and a coordinator's move. On the consumer
// protocol there is no JoinGroup: the session timeout, the coordinator's
// wait for a revocation (the rebalance timeout, 10 s) and a few heartbeats
// for the new owner to hear of the partition, plus as much again.
func (sc *scenario) groupStallLimit(cluster bool) time.Duration {
	d := sc.session + 10*time.Second + 15*time.Second + 20*time.Second
	if protocol == safeack.GroupProtocolConsumer {
		d = sc.session + 10*time.Second + 5*time.Second + 20*time.Second
	}
	if cluster {
		d += 20 * time.Second
	}
	return d
}

// maxGroupRestarts bounds the restarts of one scenario's watch: past them
// the drain times out and the scenario fails.
const maxGroupRestarts = 4

// groupWatch runs the watch of one scenario; stop ends it.
type groupWatch struct {
	sc      *scenario
	limit   time.Duration
	owned   func() [][]int32
	restart func() (string, error)

	halt, done chan struct{}
	restarts   int
}

// watchGroup starts the watch: owned returns the partitions each live
// consumer owns, restart replaces one (preferably one that owns nothing)
// and says what it did. Stop it (stop) before the scenario's checks.
func (sc *scenario) watchGroup(limit time.Duration, owned func() [][]int32, restart func() (string, error)) *groupWatch {
	w := &groupWatch{sc: sc, limit: limit, owned: owned, restart: restart, halt: make(chan struct{}), done: make(chan struct{})}
	sc.changed()
	go w.run()
	return w
}

func (w *groupWatch) stop() {
	select {
	case <-w.halt:
	default:
		close(w.halt)
	}
	<-w.done
}

func (w *groupWatch) run() {
	defer close(w.done)
	sc := w.sc
	var since time.Time // when the group last went from owning all to not
	tk := time.NewTicker(250 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-w.halt:
			return
		case <-tk.C:
		}
		unowned := unownedOf(w.owned(), sc.partitions)
		now := time.Now()
		if len(unowned) == 0 {
			since = time.Time{}
			continue
		}
		if since.IsZero() {
			since = now
		}
		from := since
		if ch := time.Unix(0, sc.lastChange.Load()); ch.After(from) {
			from = ch
		}
		if now.Sub(from) < w.limit || w.restarts >= maxGroupRestarts {
			continue
		}
		w.restarts++
		desc := sc.describeGroup()
		what, err := w.restart()
		if err != nil {
			what = fmt.Sprintf("restarting a consumer failed: %v", err)
		}
		sc.changed()
		since = time.Time{}
		msg := fmt.Sprintf("partitions %v owned by no live consumer for %v since the last change (limit %v); the broker says: %s; %s",
			unowned, now.Sub(from).Round(time.Second), w.limit, desc, what)
		sc.note("group stall: %s", msg)
		sc.mu.Lock()
		sc.groupStalls++
		if sc.c.Embedded() {
			sc.t.Logf("%s: BROKER FAULT (embedded broker, kfake): %s", sc.name, msg)
		} else {
			sc.groupIssues = append(sc.groupIssues, "group stalled: "+msg)
			sc.t.Logf("%s: GROUP STALL on a real broker (counted as a violation): %s", sc.name, msg)
		}
		sc.mu.Unlock()
	}
}

// unownedOf returns the partitions of 0..n-1 in none of sets.
func unownedOf(sets [][]int32, n int) []int32 {
	seen := make([]bool, n)
	for _, s := range sets {
		for _, p := range s {
			if p >= 0 && int(p) < n {
				seen[p] = true
			}
		}
	}
	var out []int32
	for p, ok := range seen {
		if !ok {
			out = append(out, int32(p))
		}
	}
	return out
}

// describeGroup says what the broker reports of the group: its state and
// each member's client id (chaos-member-N: consumer N) with the partitions
// assigned to it (DescribeGroups; ConsumerGroupDescribe on the consumer
// protocol, with each member's epoch and target assignment).
func (sc *scenario) describeGroup() string {
	if protocol == safeack.GroupProtocolConsumer {
		return describeConsumerGroup(sc.c, sc.group, sc.topic, sc.consumerState)
	}
	return describeGroupMembers(sc.sampler.admin, sc.group, sc.topic, func(_ string, m *sarama.GroupMemberDescription, parts string) string {
		return m.ClientId + " " + parts + " (" + sc.consumerState(m.ClientId) + ")"
	})
}

// describeGroupMembers says what the broker reports of group: its state
// and each member, as member formats it with the partitions of topic
// assigned to it (sorted; "?" when the assignment cannot be read).
func describeGroupMembers(admin sarama.ClusterAdmin, group, topic string, member func(id string, m *sarama.GroupMemberDescription, parts string) string) string {
	ds, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(ds) == 0 {
		return fmt.Sprintf("(DescribeGroups failed: %v)", err)
	}
	d := ds[0]
	if d.Err != sarama.ErrNoError {
		return fmt.Sprintf("(DescribeGroups: %v)", d.Err)
	}
	var ms []string
	for id, m := range d.Members {
		parts := "?"
		if a, err := m.GetMemberAssignment(); err == nil && a != nil {
			ps := slices.Clone(a.Topics[topic])
			slices.Sort(ps)
			parts = fmt.Sprint(ps)
		}
		ms = append(ms, member(id, m, parts))
	}
	slices.Sort(ms)
	return fmt.Sprintf("group %s, %d members: %s", d.State, len(ms), strings.Join(ms, ", "))
}

// consumerState says whether the consumer of a client id (chaos-member-N)
// is live, or since when it is gone: a member the broker still counts
// longer than a session timeout after it was killed or left is the
// broker's doing.
func (sc *scenario) consumerState(clientID string) string {
	var id int
	if _, err := fmt.Sscanf(clientID, "chaos-member-%d", &id); err != nil {
		return "not one of ours"
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	var gone int64
	found := false
	for _, ch := range sc.children {
		if ch.id == id {
			found, gone = true, ch.goneAt.Load()
		}
	}
	for _, m := range sc.members {
		if m.id == id {
			found, gone = true, m.goneAt.Load()
		}
	}
	switch {
	case !found:
		return "unknown"
	case gone == 0:
		return "live"
	}
	ago := time.Since(time.Unix(0, gone))
	s := fmt.Sprintf("gone %v ago", ago.Round(100*time.Millisecond))
	if ago > sc.session {
		s += ", past its session timeout"
	}
	return s
}
