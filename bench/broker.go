package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// brokerEnv is the cluster every contender runs against, plus the bench's
// own client for creating topics, producing and reading committed offsets.
type brokerEnv struct {
	brokers []string
	desc    string
	runID   string

	client sarama.Client
	admin  sarama.ClusterAdmin

	mu     sync.Mutex
	topics map[string]*topic // by spec name
	extra  []string          // other topics the runs created (dead-letter topics), deleted with topics
	stop   func()
}

// topic is a produced topic: its name and end offset per partition.
type topic struct {
	name string
	spec *topicSpec
	ends []int64 // high watermark per partition
	// offBase is the offset of record index p (the first of partition p)
	// per partition: 0 for a topic produced before the runs, the number of
	// warm-up records for a steady topic. nil: offsets of records unknown.
	offBase []int64
}

// offsetOf is where record i lives: partition i % partitions, offset
// offBase[p] + i / partitions (records were produced in index order, one
// request in flight).
func (t *topic) offsetOf(i int) (int, int64) {
	np := t.spec.partitions
	p := i % np
	return p, t.offBase[p] + int64(i/np)
}

// checkOffsets sets offBase to zeros when the end offsets are what
// production in index order into an empty topic gives.
func (t *topic) checkOffsets() {
	np := t.spec.partitions
	for p, end := range t.ends {
		want := int64((t.spec.n - p + np - 1) / np)
		if end != want {
			logf("topic %s partition %d ends at %d, not %d: per-record commit lag not measured", t.name, p, end, want)
			return
		}
	}
	t.offBase = make([]int64, np)
}

// consumerConfig is the Sarama configuration every contender gets: a fresh
// value each time, identical for all.
func consumerConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V4_1_0_0
	c.ClientID = "safeack-bench"
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.ChannelBufferSize = 1024
	if opt.saramaMaxWait > 0 {
		c.Consumer.MaxWaitTime = opt.saramaMaxWait
	}
	if opt.wiretap {
		c.Net.Proxy.Enable = true
		c.Net.Proxy.Dialer = &tapDialer{d: net.Dialer{Timeout: c.Net.DialTimeout, KeepAlive: c.Net.KeepAlive}}
	}
	// Everything else stays at Sarama's defaults: auto-commit every 1 s,
	// 10 s session timeout (kfake's minimum is 6 s), range assignor, fetch
	// MaxWaitTime 500 ms (-sarama-max-wait).
	return c
}

func benchClientConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V4_1_0_0
	c.ClientID = "safeack-bench-admin"
	c.Admin.Timeout = 30 * time.Second
	c.Metadata.Retry.Max = 20
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.RequiredAcks = sarama.WaitForLocal
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.Flush.Bytes = 512 << 10
	c.Producer.Flush.Frequency = 2 * time.Millisecond
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 50 * time.Millisecond
	// One request in flight keeps each partition in produce order even if a
	// batch is retried: restart-cost needs its head at offset 0.
	c.Net.MaxOpenRequests = 1
	c.ChannelBufferSize = 4096
	return c
}

func setupBroker(ctx context.Context) (*brokerEnv, error) {
	env := &brokerEnv{
		topics: map[string]*topic{},
		runID:  fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff),
		stop:   func() {},
	}
	switch {
	case len(opt.brokers) > 0:
		env.brokers = opt.brokers
		env.desc = "real cluster " + strings.Join(opt.brokers, ",")
	case opt.inprocBroker:
		c, err := kfake.NewCluster(kfakeOpts(opt.churnHeartbeat)...)
		if err != nil {
			return nil, err
		}
		env.brokers = c.ListenAddrs()
		env.desc = "embedded kfake, 1 broker, IN this process (its CPU/memory count in every figure) at " + strings.Join(env.brokers, ",")
		env.stop = c.Close
	default:
		addrs, cmd, closeFn, err := startKfakeChild()
		if err != nil {
			return nil, err
		}
		env.brokers = addrs
		env.desc = fmt.Sprintf("embedded kfake, 1 broker, in a child process (pid %d) at %s; CPU/memory figures are the consumer process only",
			cmd.Process.Pid, strings.Join(addrs, ","))
		env.stop = closeFn
	}
	client, err := sarama.NewClient(env.brokers, benchClientConfig())
	if err != nil {
		env.stop()
		return nil, fmt.Errorf("client for %v: %w", env.brokers, err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		_ = client.Close()
		env.stop()
		return nil, err
	}
	env.client, env.admin = client, admin
	return env, nil
}

func (env *brokerEnv) close() {
	if env.admin != nil && len(opt.brokers) > 0 && !opt.keepTopics {
		env.mu.Lock()
		for _, t := range env.topics {
			if err := env.admin.DeleteTopic(t.name); err != nil {
				logf("delete topic %s: %v", t.name, err)
			}
		}
		for _, name := range env.extra {
			if err := env.admin.DeleteTopic(name); err != nil {
				logf("delete topic %s: %v", name, err)
			}
		}
		env.mu.Unlock()
	}
	if env.admin != nil {
		_ = env.admin.Close() // closes the client too
	}
	env.stop()
}

// addTopic has a topic a run created deleted at the end, like the produced
// ones.
func (env *brokerEnv) addTopic(name string) {
	env.mu.Lock()
	env.extra = append(env.extra, name)
	env.mu.Unlock()
}

// topicFor returns the produced topic for spec, creating and filling it on
// first use. A spec is produced once per invocation; each run reads it with a
// fresh consumer group.
func (env *brokerEnv) topicFor(ctx context.Context, spec *topicSpec) (*topic, error) {
	env.mu.Lock()
	defer env.mu.Unlock()
	if t, ok := env.topics[spec.name]; ok {
		return t, nil
	}
	name := fmt.Sprintf("bench-%s-%s", env.runID, spec.name)
	if err := env.createTopic(ctx, name, spec.partitions); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := env.produce(ctx, name, spec); err != nil {
		return nil, fmt.Errorf("produce %s: %w", name, err)
	}
	el := time.Since(start)
	t := &topic{name: name, spec: spec}
	total := int64(0)
	for p := range spec.partitions {
		end, err := env.client.GetOffset(name, int32(p), sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("end offset %s/%d: %w", name, p, err)
		}
		t.ends = append(t.ends, end)
		total += end
	}
	if total != int64(spec.n) {
		return nil, fmt.Errorf("topic %s holds %d records, want %d", name, total, spec.n)
	}
	t.checkOffsets()
	logf("produced %d records of %d B into %s (%d partitions) in %v (%.0f/s)",
		spec.n, spec.valueSize, name, spec.partitions, el.Round(time.Millisecond), float64(spec.n)/el.Seconds())
	env.topics[spec.name] = t
	return t, nil
}

func (env *brokerEnv) createTopic(ctx context.Context, name string, partitions int) error {
	err := env.admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := env.client.RefreshMetadata(name); err == nil {
			if ps, err := env.client.Partitions(name); err == nil && len(ps) == partitions {
				ok := true
				for _, p := range ps {
					if _, err := env.client.Leader(name, p); err != nil {
						ok = false
					}
				}
				if ok {
					return nil
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("topic %s not ready", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// produce writes spec.n records with an async producer: record i goes to
// partition spec.partition(i), carries key spec.key(i) and a value of
// spec.valueSize bytes whose first 8 bytes are i (big endian). Consumers
// identify records by that index.
func (env *brokerEnv) produce(ctx context.Context, name string, spec *topicSpec) error {
	p, err := sarama.NewAsyncProducerFromClient(env.client)
	if err != nil {
		return err
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		firstEr error
		okCount int
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for range p.Successes() {
			okCount++
		}
	}()
	go func() {
		defer wg.Done()
		for e := range p.Errors() {
			mu.Lock()
			if firstEr == nil {
				firstEr = e.Err
			}
			mu.Unlock()
		}
	}()
	in := p.Input()
	for i := range spec.n {
		if ctx.Err() != nil {
			break
		}
		v := make([]byte, max(spec.valueSize, 8))
		binary.BigEndian.PutUint64(v, uint64(i))
		for j := 8; j < len(v); j++ {
			v[j] = byte('a' + (i+j)%26)
		}
		m := &sarama.ProducerMessage{Topic: name, Partition: spec.partition(i), Value: sarama.ByteEncoder(v)}
		if k := spec.key(i); k != nil {
			m.Key = sarama.ByteEncoder(k)
		}
		in <- m
	}
	p.AsyncClose()
	wg.Wait()
	if firstEr != nil {
		return firstEr
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if okCount != spec.n {
		return fmt.Errorf("%d of %d records acknowledged", okCount, spec.n)
	}
	return nil
}

// committed returns the group's committed offset and metadata per
// partition of t (-1 and "" where nothing is committed).
func (env *brokerEnv) committed(t *topic, group string) ([]int64, []string, error) {
	parts := make([]int32, len(t.ends))
	for i := range parts {
		parts[i] = int32(i)
	}
	resp, err := env.admin.ListConsumerGroupOffsets(group, map[string][]int32{t.name: parts})
	if err != nil {
		return nil, nil, err
	}
	offs := make([]int64, len(parts))
	metas := make([]string, len(parts))
	for i, p := range parts {
		offs[i] = -1
		if b := resp.GetBlock(t.name, p); b != nil && b.Err == sarama.ErrNoError {
			offs[i], metas[i] = b.Offset, b.Metadata
		}
	}
	return offs, metas, nil
}

// waitCommitted polls until every partition's committed offset reached its
// end, or timeout. It reports when that happened.
func (env *brokerEnv) waitCommitted(ctx context.Context, t *topic, group string, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	for {
		offs, _, err := env.committed(t, group)
		if err == nil {
			done := true
			for i, o := range offs {
				if o < t.ends[i] {
					done = false
					break
				}
			}
			if done {
				return time.Now(), true
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return time.Time{}, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
