package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/safeacktest"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

func frontierOf(t *testing.T, base string) frontierView {
	t.Helper()
	code, body := get(t, base+"/api/frontier")
	if code != http.StatusOK {
		t.Fatalf("/api/frontier: %d %s", code, body)
	}
	var v frontierView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/api/frontier: %v in %s", err, body)
	}
	return v
}

func committedSum(v frontierView) (sum int64, all bool) {
	all = len(v.Partitions) > 0
	for _, p := range v.Partitions {
		if p.Committed <= 0 {
			all = false
			continue
		}
		sum += p.Committed
	}
	return sum, all
}

// testConfig is a small, quick run on the embedded broker with a bit of
// everything: slow records, poison records, flaky handler runs.
func testConfig(out io.Writer) Config {
	cfg := DefaultConfig()
	cfg.Partitions = 4
	cfg.Rate = 200
	cfg.Keys = 50
	cfg.MinLatency, cfg.MaxLatency = time.Millisecond, 20*time.Millisecond
	cfg.SlowRate, cfg.SlowLatency = 0.01, 700*time.Millisecond
	cfg.PoisonRate = 0.01
	cfg.FlakyRate = 0.02
	cfg.CommitInterval = 200 * time.Millisecond
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.Out = out
	return cfg
}

func TestRunHandlesCommitsAndServes(t *testing.T) {
	out := &safeacktest.Buffer{}
	cfg := testConfig(out)
	addrs := make(chan string, 1)
	cfg.OnListen = func(addr string) { addrs <- addr }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg) }()

	var base string
	select {
	case addr := <-addrs:
		base = "http://" + addr
	case err := <-done:
		t.Fatalf("run returned before serving: %v\n%s", err, out)
	case <-time.After(30 * time.Second):
		t.Fatalf("no HTTP address after 30s\n%s", out)
	}

	// Records get handled and every partition's commit moves past zero.
	var first frontierView
	deadline := time.Now().Add(45 * time.Second)
	for {
		first = frontierOf(t, base)
		if _, all := committedSum(first); all && len(first.Partitions) == cfg.Partitions && first.Handled > 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no commits on every partition after 45s: %+v\n%s", first, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if first.Topic != cfg.Topic || first.Ordering != safeack.OrderByKey.String() || !first.Embedded {
		t.Fatalf("frontier header: %+v", first)
	}
	// The page shows the commit period that runs: the -commit-interval
	// flag's, which takes effect with Sarama's auto-commit on.
	if first.CommitInterval != cfg.CommitInterval.Seconds() {
		t.Errorf("the page shows a commit period of %vs, want the flag's %v", first.CommitInterval, cfg.CommitInterval)
	}
	for _, p := range first.Partitions {
		if p.Committed > p.Safe || p.Safe > p.Delivered {
			t.Errorf("partition %d: committed %d, safe %d, delivered %d out of order", p.Partition, p.Committed, p.Safe, p.Delivered)
		}
		prevTo := int64(-1)
		blocked, records := 0, 0
		for i, r := range p.Runs {
			from, to, n, doneRun := r[0], r[1], r[2], r[3]
			if from < p.Safe || to > p.Delivered || from >= to || n <= 0 || (i == 0 && doneRun != 0) || (prevTo >= 0 && from != prevTo) {
				t.Errorf("partition %d: run %d %v does not fit [safe %d, delivered %d) after %d", p.Partition, i, r, p.Safe, p.Delivered, prevTo)
			}
			prevTo = to
			records += int(n)
			if doneRun == 1 {
				blocked += int(n)
			}
		}
		if !p.Truncated && (records != p.Retained || blocked != p.Blocked) {
			t.Errorf("partition %d: runs count %d records, %d blocked; stats %d, %d", p.Partition, records, blocked, p.Retained, p.Blocked)
		}
	}

	// The commits keep advancing.
	before, _ := committedSum(first)
	deadline = time.Now().Add(30 * time.Second)
	for {
		v := frontierOf(t, base)
		if sum, _ := committedSum(v); sum > before+100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("commits stopped at %d\n%s", before, out)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// /metrics answers with safeack's collector and the example's own.
	code, metrics := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	for _, want := range []string{
		fmt.Sprintf(`safeack_confirmed_offset{partition="0",topic=%q}`, cfg.Topic),
		fmt.Sprintf(`safeack_safe_offset{partition="3",topic=%q}`, cfg.Topic),
		fmt.Sprintf(`safeack_completed_records_total{partition="1",topic=%q}`, cfg.Topic),
		"safeack_owned_partitions 4",
		`safeack_demo_handler_runs_total{outcome="ack"}`,
		"safeack_demo_produced_records_total",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// The live page and its assets.
	for path, want := range map[string]string{
		"/":          "<title>safeack live</title>",
		"/app.js":    "/api/frontier",
		"/style.css": "--blocked",
	} {
		if code, body := get(t, base+path); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d, lacks %q", path, code, want)
		}
	}

	// Stopping drains and reports the final commits.
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\n%s", err, out)
		}
	case <-time.After(45 * time.Second):
		t.Fatalf("run did not return within 45s of cancellation\n%s", out)
	}
	log := out.String()
	for _, want := range []string{"embedded Kafka-protocol broker", "live page: http://", " p0 ", "stopping: draining", "committed/end of log: p0 "} {
		if !strings.Contains(log, want) {
			t.Errorf("output lacks %q:\n%s", want, log)
		}
	}
}

func TestRunStopsAfterDuration(t *testing.T) {
	out := &safeacktest.Buffer{}
	cfg := testConfig(out)
	cfg.HTTPAddr = ""
	cfg.Duration = 3 * time.Second
	start := time.Now()
	if err := run(context.Background(), cfg); err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if d := time.Since(start); d < cfg.Duration || d > cfg.Duration+30*time.Second {
		t.Fatalf("run took %v with -duration %v", d, cfg.Duration)
	}
	if !strings.Contains(out.String(), "committed/end of log:") {
		t.Fatalf("no final report:\n%s", out)
	}
}

func TestParseFlags(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	cfg, err := parseFlags(nil, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Brokers) != 0 || cfg.HTTPAddr != "127.0.0.1:8080" || cfg.Partitions != 6 || cfg.Duration != 0 {
		t.Fatalf("defaults: %+v", cfg)
	}

	cfg, err = parseFlags([]string{"-duration", "5s", "-http", "", "-ordering", "unordered", "-rate", "50"},
		env(map[string]string{"KAFKA_BROKERS": "k1:9092, k2:9092"}))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(cfg.Brokers) != "[k1:9092 k2:9092]" || cfg.Duration != 5*time.Second || cfg.HTTPAddr != "" ||
		cfg.Ordering != safeack.Unordered || cfg.Rate != 50 {
		t.Fatalf("parsed: %+v", cfg)
	}

	cfg, err = parseFlags([]string{"-brokers", "b:1"}, env(map[string]string{"KAFKA_BROKERS": "k1:9092", "SAFEACK_KAFKA_BROKERS": "s1:9092"}))
	if err != nil || fmt.Sprint(cfg.Brokers) != "[b:1]" {
		t.Fatalf("-brokers over the environment: %v %+v", err, cfg.Brokers)
	}

	// SAFEACK_KAFKA_BROKERS, which the README and scripts/kafka.sh use,
	// wins over KAFKA_BROKERS, which still works alone.
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SAFEACK_KAFKA_BROKERS": "s1:9092,s2:9092"}, "[s1:9092 s2:9092]"},
		{map[string]string{"SAFEACK_KAFKA_BROKERS": "s1:9092", "KAFKA_BROKERS": "k1:9092"}, "[s1:9092]"},
		{map[string]string{"KAFKA_BROKERS": "k1:9092"}, "[k1:9092]"},
		{map[string]string{"SAFEACK_KAFKA_BROKERS": "", "KAFKA_BROKERS": "k1:9092"}, "[k1:9092]"},
	} {
		cfg, err = parseFlags(nil, env(tc.env))
		if err != nil || fmt.Sprint(cfg.Brokers) != tc.want {
			t.Errorf("environment %v: brokers %v, %v; want %s", tc.env, cfg.Brokers, err, tc.want)
		}
	}

	for _, bad := range [][]string{
		{"-ordering", "random"},
		{"-partitions", "0"},
		{"-slow-rate", "2"},
		{"-min-latency", "2s", "-max-latency", "1s"},
		{"-dlq", "safeack-demo-orders"},
		{"-kafka-version", "banana"},
		{"extra"},
	} {
		if _, err := parseFlags(bad, env(nil)); err == nil || errors.Is(err, flag.ErrHelp) {
			t.Errorf("parseFlags(%q) = %v; want an error", bad, err)
		}
	}
}

// TestRunTracesToStdout runs the example with -trace-stdout's writer and
// reads the printed spans back: deliveries linked to the records' send
// spans, handler spans inside deliveries, and commits.
func TestRunTracesToStdout(t *testing.T) {
	out, traces := &safeacktest.Buffer{}, &safeacktest.Buffer{}
	cfg := testConfig(out)
	cfg.HTTPAddr = ""
	cfg.Rate = 20
	cfg.SlowRate, cfg.PoisonRate = 0, 0
	cfg.Duration = 3 * time.Second
	cfg.TraceOut = traces
	if err := run(context.Background(), cfg); err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	type spanContext struct{ TraceID, SpanID string }
	type span struct {
		Name        string
		SpanContext spanContext
		Parent      spanContext
		Links       []struct{ SpanContext spanContext }
	}
	spans := map[string][]span{}
	byID := map[string]span{}
	dec := json.NewDecoder(strings.NewReader(traces.String()))
	for dec.More() {
		var s span
		if err := dec.Decode(&s); err != nil {
			t.Fatalf("decoding the printed spans: %v", err)
		}
		kind := strings.Fields(s.Name)[0]
		spans[kind] = append(spans[kind], s)
		byID[s.SpanContext.SpanID] = s
	}
	if len(spans["send"]) == 0 || len(spans["process"]) == 0 || len(spans["handle"]) == 0 || len(spans["commit"]) == 0 {
		t.Fatalf("spans printed: %d send, %d process, %d handle, %d commit", len(spans["send"]), len(spans["process"]), len(spans["handle"]), len(spans["commit"]))
	}
	for _, p := range spans["process"] {
		if len(p.Links) != 1 || byID[p.Links[0].SpanContext.SpanID].Name != "send "+cfg.Topic {
			t.Fatalf("delivery span %+v: not linked to a send span", p)
		}
	}
	for _, h := range spans["handle"] {
		if byID[h.Parent.SpanID].Name != "process "+cfg.Topic {
			t.Fatalf("handler span %+v: its parent is not a delivery span", h)
		}
	}
}
