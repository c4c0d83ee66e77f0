package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack"
)

// commitWait is how long restart-cost waits after the last ack behind the
// head before crashing: safeack may hold a mark back up to one commit
// interval (it encodes the tail at most once per interval) and Sarama
// commits on its own 1 s tick, so two intervals plus margin.
const commitWait = 2500 * time.Millisecond

func restartCost() *workload {
	const behind = 10_000
	lead := opt.restartLead
	n := lead + behind + 1
	t := &topicSpec{name: fmt.Sprintf("restart-l%d", lead), partitions: 1, n: n, valueSize: valueSize, keys: -1}
	base := map[string]string{"MaxPendingPerPartition": "20000"}
	w := &workload{
		name: "restart-cost",
		desc: fmt.Sprintf("1 partition: %d records acked, then a head record never acked (offset %d), %d records completed behind it, commit, crash, restart in the same group", lead, lead, behind),
		cols: []string{"x:behind", "x:committed", "x:meta", "x:crash", "x:phase2", "x:dups", "x:recovery"},
		run:  runRestart,
	}
	add := func(label string, ord safeack.Ordering, extra map[string]string) {
		set := maps.Clone(base)
		maps.Copy(set, extra)
		w.cases = append(w.cases, &caseSpec{label: label, kind: kindSafeack, ordering: ord, topic: t, conc: 100, settings: set})
	}
	add("safeack/unordered", safeack.Unordered, nil)
	add("safeack/key", safeack.OrderByKey, nil)
	for _, v := range opt.restartWith {
		missing := ""
		for f := range v.settings {
			if !hasField(f) {
				missing = f
			}
		}
		if missing != "" {
			w.notes = append(w.notes, fmt.Sprintf("variant %q skipped: safeack.SubscriberConfig has no field %s", v.name, missing))
			continue
		}
		add("safeack/unordered +"+v.name, safeack.Unordered, v.settings)
		add("safeack/key +"+v.name, safeack.OrderByKey, v.settings)
	}
	crash := "Crash = Close() with DrainTimeout 1 ms, in this process: contexts are cancelled, the head is abandoned without an ack, " +
		"safeack marks what is safe and Sarama's final auto-commit flush and LeaveGroup still run (an abrupt shutdown, not a kill -9)."
	if opt.restartCrash == "kill" {
		crash = "Crash = SIGKILL of a child process running the first consumer: no drain, no final commit, no LeaveGroup; " +
			"the restart waits for the broker to expire the dead member (Sarama's 10 s session timeout)."
	}
	w.notes = append(w.notes,
		"Records have unique keys, so key mode is not blocked by the head. MaxInFlight 100, MaxPendingPerPartition 20,000.",
		fmt.Sprintf("After the %d-th ack behind the head the first consumer waits %v (two auto-commit intervals + 0.5 s: safeack encodes the tail at most once per interval, Sarama commits on its own tick); committed@crash and meta B are then read with OffsetFetch.", behind, commitWait),
		crash,
		"Then a new Subscriber joins the same group and acks everything; recovery = its start until the committed offset reaches the end.",
		"handled twice = records whose handler started in both consumers (the head always counts: it was started, never acked). With a completed tail in the commit metadata this should be 1; without, the head and all 10,000 behind it.",
		"Variants: -restart-with name:Field=value,... (default no-tail:DisableCompletedTail=true) add rows with those SubscriberConfig settings.",
	)
	return w
}

func runRestart(ctx context.Context, env *brokerEnv, w *workload) (*section, error) {
	sec := newSection(w)
	failed, err := repeatCases(ctx, sec, selectedOnly(w), 30, func(c *caseSpec, rep int) (*result, error) {
		t, err := env.topicFor(ctx, c.topic)
		if err != nil {
			return nil, err
		}
		return restartOnce(ctx, env, w, c, t, rep), nil
	}, func(r *result) string {
		return fmt.Sprintf("behind %.0f committed %.0f meta %.0fB crash %.3fs handled-after %.0f twice %.0f recovery %.3fs",
			r.extra["behind"], r.extra["committed"], r.extra["meta"], r.extra["crash"], r.extra["phase2"], r.extra["dups"], r.extra["recovery"])
	})
	if err != nil {
		return sec, err
	}
	return sec, failed
}

// restartSpec is what the first consumer needs; it crosses a process
// boundary in kill mode.
type restartSpec struct {
	Brokers  []string          `json:"brokers"`
	Topic    string            `json:"topic"`
	Group    string            `json:"group"`
	N        int               `json:"n"`
	Head     int               `json:"head"` // index (= offset) of the record never acked
	Ordering int               `json:"ordering"`
	Conc     int               `json:"conc"`
	Settings map[string]string `json:"settings"`
}

func restartOnce(ctx context.Context, env *brokerEnv, w *workload, c *caseSpec, t *topic, rep int) *result {
	r := &result{n: c.topic.n, retained: -1, commit: -1, extra: map[string]float64{}}
	spec := restartSpec{
		Brokers: env.brokers, Topic: t.name, Group: groupName(env, w.name, c.label, rep),
		N: c.topic.n, Head: opt.restartLead, Ordering: int(c.ordering), Conc: c.conc, Settings: c.settings,
	}
	started1 := make([]atomic.Bool, spec.N)
	var behind int
	var crash time.Duration
	var err error
	if opt.restartCrash == "kill" {
		behind, crash, err = phase1Kill(ctx, env, t, spec)
		for i := range started1 {
			started1[i].Store(true) // the child started every record before it reported READY
		}
	} else {
		behind, crash, err = phase1Close(ctx, env, t, spec, started1)
	}
	r.extra["behind"] = float64(behind)
	r.extra["crash"] = crash.Seconds()
	if err != nil {
		r.err = err
		return r
	}
	// committed@crash was read before the crash by the phase-1 helpers.
	offs, metas := lastCommitted.offs, lastCommitted.metas
	r.extra["committed"] = float64(offs[0])
	r.extra["meta"] = float64(len(metas[0]))

	// Phase 2: a new consumer in the same group acks everything.
	started2 := make([]atomic.Bool, spec.N)
	cfg, err := restartConfig(spec, false)
	if err != nil {
		r.err = err
		return r
	}
	s, err := safeack.NewSubscriber(cfg, nil)
	if err != nil {
		r.err = err
		return r
	}
	t0 := time.Now()
	ch, err := s.Subscribe(ctx, t.name)
	if err != nil {
		_ = s.Close()
		r.err = err
		return r
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for m := range ch {
			go func(m *message.Message) {
				if i := recordIndex(m.Payload); i >= 0 && i < spec.N {
					started2[i].Store(true)
				}
				m.Ack()
			}(m)
		}
	}()
	at, ok := env.waitCommitted(ctx, t, spec.Group, 60*time.Second)
	if ok {
		r.extra["recovery"] = at.Sub(t0).Seconds()
	} else {
		r.err = fmt.Errorf("restarted consumer did not commit the end of the partition within 60 s")
	}
	_ = s.Close()
	wg.Wait()
	phase2, twice := 0, 0
	for i := range started2 {
		if started2[i].Load() {
			phase2++
			if started1[i].Load() {
				twice++
			}
		}
	}
	r.extra["phase2"] = float64(phase2)
	r.extra["dups"] = float64(twice)
	return r
}

// lastCommitted carries the committed state read just before the crash
// (runs are sequential).
var lastCommitted struct {
	offs  []int64
	metas []string
}

func restartConfig(spec restartSpec, first bool) (safeack.SubscriberConfig, error) {
	cfg := safeack.SubscriberConfig{
		Brokers:               spec.Brokers,
		OverwriteSaramaConfig: consumerConfig(),
		ConsumerGroup:         spec.Group,
		MaxInFlight:           spec.Conc,
		Ordering:              safeack.Ordering(spec.Ordering),
	}
	if first {
		cfg.DrainTimeout = time.Millisecond
	}
	if err := applySettings(&cfg, opt.safeackSet); err != nil {
		return cfg, err
	}
	return cfg, applySettings(&cfg, spec.Settings)
}

// runPhase1 consumes until every record behind the head (index 0) is acked,
// holding the head unacked, then waits commitWait. It returns the
// subscriber, still running.
func runPhase1(ctx context.Context, spec restartSpec, started []atomic.Bool) (*safeack.Subscriber, int, error) {
	cfg, err := restartConfig(spec, true)
	if err != nil {
		return nil, 0, err
	}
	s, err := safeack.NewSubscriber(cfg, nil)
	if err != nil {
		return nil, 0, err
	}
	ch, err := s.Subscribe(ctx, spec.Topic)
	if err != nil {
		_ = s.Close()
		return nil, 0, err
	}
	var acked, behind atomic.Int64
	all := make(chan struct{})
	go func() {
		for m := range ch {
			i := recordIndex(m.Payload)
			if i >= 0 && i < spec.N {
				started[i].Store(true)
			}
			if i == spec.Head {
				continue // the head: started, never acked
			}
			go func(m *message.Message) {
				m.Ack()
				if i > spec.Head {
					behind.Add(1)
				}
				if acked.Add(1) == int64(spec.N-1) {
					close(all)
				}
			}(m)
		}
	}()
	select {
	case <-all:
	case <-time.After(opt.runTimeout):
		_ = s.Close()
		return nil, int(behind.Load()), fmt.Errorf("only %d of %d records other than the head acked", acked.Load(), spec.N-1)
	case <-ctx.Done():
		_ = s.Close()
		return nil, int(behind.Load()), ctx.Err()
	}
	time.Sleep(commitWait)
	return s, int(behind.Load()), nil
}

func phase1Close(ctx context.Context, env *brokerEnv, t *topic, spec restartSpec, started []atomic.Bool) (int, time.Duration, error) {
	s, behind, err := runPhase1(ctx, spec, started)
	if err != nil {
		return behind, 0, err
	}
	if err := readCommitted(env, t, spec.Group); err != nil {
		_ = s.Close()
		return behind, 0, err
	}
	t0 := time.Now()
	_ = s.Close()
	return behind, time.Since(t0), nil
}

func readCommitted(env *brokerEnv, t *topic, group string) error {
	offs, metas, err := env.committed(t, group)
	if err != nil {
		return fmt.Errorf("offset fetch: %w", err)
	}
	lastCommitted.offs, lastCommitted.metas = offs, metas
	return nil
}

// phase1Kill runs the first consumer in a child process and SIGKILLs it once
// it reports that everything behind the head is acked and a commit interval
// passed.
func phase1Kill(ctx context.Context, env *brokerEnv, t *topic, spec restartSpec) (int, time.Duration, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	js, _ := json.Marshal(spec)
	args := []string{"-restart-child", string(js)}
	if len(opt.safeackSet) > 0 {
		var kv []string
		for k, v := range opt.safeackSet {
			kv = append(kv, k+"="+v)
		}
		args = append(args, "-safeack-set", strings.Join(kv, ","))
	}
	args = append(args, "-run-timeout", opt.runTimeout.String())
	cmd := exec.CommandContext(ctx, exe, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	var behind int
	if err == nil {
		_, err = fmt.Sscanf(line, "READY %d", &behind)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return 0, 0, fmt.Errorf("restart child: %q: %v", line, err)
	}
	if err := readCommitted(env, t, spec.Group); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return behind, 0, err
	}
	t0 := time.Now()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	return behind, time.Since(t0), nil
}

// runRestartChild is the child side of phase1Kill.
func runRestartChild(js string) {
	var spec restartSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fatalf("restart child: %v", err)
	}
	m, err := parseSettings(flag.Lookup("safeack-set").Value.String())
	if err != nil {
		fatalf("restart child: %v", err)
	}
	opt.safeackSet = m
	if d, err := time.ParseDuration(flag.Lookup("run-timeout").Value.String()); err == nil {
		opt.runTimeout = d
	}
	started := make([]atomic.Bool, spec.N)
	_, behind, err := runPhase1(context.Background(), spec, started)
	if err != nil {
		fatalf("restart child: %v", err)
	}
	fmt.Printf("READY %d\n", behind)
	select {} // wait for SIGKILL
}
