package safeack_test

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// BenchmarkShareZero measures the CPU and rate of share group consumers at
// zero work on the embedded broker: safeack's ShareSubscriber read through
// a Router (as the bench's share-zero does) and through its channel, and a
// bare kgo share consumer doing the same (accept each record), with the
// options safeack sets. Each iteration is a fresh share group reading the
// same SAFEACK_SHARE_PERF_N records (default 50,000; 100 B, 8 partitions),
// SAFEACK_SHARE_PERF_MAXINFLIGHT (default 64) records per poll.
//
// The broker runs in this process: its goroutines carry the pprof label
// side=broker and the consumer's side=client, so a profile splits them
// (go tool pprof -tagfocus side=client). With SAFEACK_SHARE_PERF_PROFILE=dir
// each sub-benchmark writes dir/<name>.cpu.pprof (its consume phase) and
// dir/<name>.heap.pprof with dir/<name>.heap0.pprof as its -base.
//
//	go test -run '^$' -bench BenchmarkShareZero -benchtime 1x .
func BenchmarkShareZero(b *testing.B) {
	n := 50_000
	if v := os.Getenv("SAFEACK_SHARE_PERF_N"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	if v := os.Getenv("SAFEACK_SHARE_PERF_MAXINFLIGHT"); v != "" {
		var err error
		perfMaxInFlight, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	if v := os.Getenv("SAFEACK_SHARE_PERF_FETCH_BYTES"); v != "" {
		fb, err := strconv.Atoi(v)
		require.NoError(b, err)
		perfFetchOpts = []kgo.Opt{kgo.FetchMaxBytes(int32(fb)), kgo.FetchMaxPartitionBytes(int32(fb))}
	}
	var c *kafkatest.Cluster
	pprof.Do(context.Background(), pprof.Labels("side", "broker"), func(context.Context) {
		c = startShareCluster(b, 0)
	})
	topic := c.NewTopic(b, 8)
	produceIndexed(b, c, topic, n)

	consumers := []struct {
		name string
		run  func(b *testing.B, group string, got func(i int))
	}{
		{"kgo", func(b *testing.B, group string, got func(int)) { runKgoShare(b, c, topic, group, n, true, got) }},
		{"kgo-loose", func(b *testing.B, group string, got func(int)) { runKgoShare(b, c, topic, group, n, false, got) }},
		{"safeack-chan", func(b *testing.B, group string, got func(int)) { runSafeackShare(b, c, topic, group, n, false, got) }},
		{"safeack-router", func(b *testing.B, group string, got func(int)) { runSafeackShare(b, c, topic, group, n, true, got) }},
	}
	for _, cons := range consumers {
		b.Run(cons.name, func(b *testing.B) {
			var cpu, wall time.Duration
			var mallocs uint64
			read0 := shareBytesRead.Load()
			for i := range b.N {
				group := c.NewGroup(b)
				setEarliest(b, c, group)
				m := measureShare(b, cons.name, i, n, func(got func(int)) {
					pprof.Do(context.Background(), pprof.Labels("side", "client"), func(context.Context) {
						cons.run(b, group, got)
					})
				})
				cpu += m.cpu
				wall += m.wall
				mallocs += m.mallocs
			}
			recs := float64(n * b.N)
			b.ReportMetric(recs/wall.Seconds(), "rec/s")
			b.ReportMetric(float64(cpu.Microseconds())/recs, "cpu-us/rec")
			b.ReportMetric(float64(mallocs)/recs, "mallocs/rec")
			if read := shareBytesRead.Load() - read0; strings.HasPrefix(cons.name, "kgo") {
				b.ReportMetric(float64(read)/recs, "read-B/rec")
			}
		})
	}
}

// perfMaxInFlight is the records per poll of every consumer (MaxInFlight
// and MaxPollRecords of a ShareSubscriber): SAFEACK_SHARE_PERF_MAXINFLIGHT, default
// safeack.DefaultMaxInFlight.
var perfMaxInFlight = safeack.DefaultMaxInFlight

// perfFetchOpts are kgo options given to the strict kgo consumer and to
// the ShareSubscriber (ClientOptions): SAFEACK_SHARE_PERF_FETCH_BYTES sets
// FetchMaxBytes and FetchMaxPartitionBytes.
var perfFetchOpts []kgo.Opt

// shareMeasure is one consume phase: the wall time from the first record
// taken to the last one answered, and from the consumer's start to the
// last answer the CPU time of the whole process (an embedded broker
// included) and the allocations.
type shareMeasure struct {
	wall, cpu time.Duration
	mallocs   uint64
}

// measureShare runs consume, which calls got once per record answered
// (index i of produceIndexed), and returns once all n were answered.
func measureShare(b *testing.B, name string, iter, n int, consume func(got func(int))) shareMeasure {
	dir := os.Getenv("SAFEACK_SHARE_PERF_PROFILE")
	prefix := ""
	if dir != "" {
		prefix = filepath.Join(dir, name+"."+strconv.Itoa(iter))
	}
	var (
		seen      = make([]atomic.Bool, n)
		count     atomic.Int64
		firstOnce sync.Once
		allDone   = make(chan struct{})
		m         shareMeasure
		start     time.Time
		cpu0      time.Duration
		ms0       runtime.MemStats
	)
	got := func(i int) {
		firstOnce.Do(func() {
			start = time.Now()
		})
		if i < 0 || i >= n || seen[i].Swap(true) {
			return
		}
		if count.Add(1) == int64(n) {
			m.wall, m.cpu = time.Since(start), processCPU()-cpu0
			if prefix != "" {
				pprof.StopCPUProfile()
				writeHeapProfile(b, prefix+".heap.pprof")
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			m.mallocs = ms.Mallocs - ms0.Mallocs
			close(allDone)
		}
	}
	if prefix != "" {
		writeHeapProfile(b, prefix+".heap0.pprof")
		f, err := os.Create(prefix + ".cpu.pprof")
		require.NoError(b, err)
		require.NoError(b, pprof.StartCPUProfile(f))
	}
	runtime.ReadMemStats(&ms0)
	cpu0 = processCPU()
	go consume(got)
	select {
	case <-allDone:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%s: %d of %d records answered in 5 minutes", name, count.Load(), n)
	}
	return m
}

func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	require.NoError(b, err)
	defer f.Close()
	require.NoError(b, pprof.Lookup("allocs").WriteTo(f, 0))
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// produceIndexed produces n records of 100 B, record i to partition i % 8,
// its index in its first 8 bytes, in batches of up to
// SAFEACK_SHARE_PERF_BATCH_BYTES (kgo's default 1 MB: here a partition's
// records fit in one or two batches).
func produceIndexed(b *testing.B, c *kafkatest.Cluster, topic string, n int) {
	opts := append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if v := os.Getenv("SAFEACK_SHARE_PERF_BATCH_BYTES"); v != "" {
		bb, err := strconv.Atoi(v)
		require.NoError(b, err)
		opts = append(opts, kgo.ProducerBatchMaxBytes(int32(bb)))
	}
	cl, err := kgo.NewClient(opts...)
	require.NoError(b, err)
	defer cl.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	var failed atomic.Value
	for i := range n {
		v := make([]byte, 100)
		binary.BigEndian.PutUint64(v, uint64(i))
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Topic: topic, Partition: int32(i % 8), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Store(err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatalf("producing: %v", err)
	}
}

// setEarliest sets the group's share.auto.offset.reset to earliest.
func setEarliest(b *testing.B, c *kafkatest.Cluster, group string) {
	cl, err := kgo.NewClient(append(c.KgoOpts(), kgo.SeedBrokers(c.Brokers()...))...)
	require.NoError(b, err)
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = group
	for name, value := range map[string]string{"share.auto.offset.reset": "earliest", "share.heartbeat.interval.ms": "500"} {
		cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		cfg.Name, cfg.Value = name, &value
		res.Configs = append(res.Configs, cfg)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(context.Background(), cl)
	require.NoError(b, err)
	for _, r := range resp.Resources {
		require.NoError(b, kerr.ErrorForCode(r.ErrorCode))
	}
}

// runKgoShare is a bare kgo share consumer: it accepts each record of a
// poll (perfMaxInFlight) and polls again. strict: with the options a ShareSubscriber
// member sets (at most 64 records acquired per fetch, one fetch per poll);
// else kgo's defaults beside ShareMaxRecords (the broker may acquire
// whole batches, fetches run ahead of polls).
func runKgoShare(b *testing.B, c *kafkatest.Cluster, topic, group string, n int, strict bool, got func(int)) {
	opts := append(c.KgoOpts(),
		kgo.SeedBrokers(c.Brokers()...),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.ShareGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ShareMaxRecords(int32(perfMaxInFlight)),
	)
	if strict {
		opts = append(opts, kgo.ShareMaxRecordsStrict(), kgo.MaxConcurrentFetches(0))
		opts = append(opts, perfFetchOpts...)
	}
	opts = append(opts, kgo.WithHooks(shareReadBytes{}))
	cl, err := kgo.NewClient(opts...)
	require.NoError(b, err)
	defer cl.Close()
	var done int
	for done < n {
		fs := cl.PollRecords(context.Background(), perfMaxInFlight)
		if fs.IsClientClosed() {
			return
		}
		fs.EachRecord(func(r *kgo.Record) {
			r.Ack(kgo.AckAccept)
			done++
			got(recordIdx(r.Value))
		})
	}
}

// runSafeackShare consumes through a ShareSubscriber (MaxInFlight 64, one
// member), acking each message, through a Router or straight from the
// channel.
func runSafeackShare(b *testing.B, c *kafkatest.Cluster, topic, group string, n int, router bool, got func(int)) {
	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
		Brokers:       c.Brokers(),
		ShareGroup:    group,
		InitialOffset: sarama.OffsetOldest,
		// One member polling as the bare kgo consumer does: the
		// figures compare the clients' cost per record, not the
		// hand-out (the bench's share workloads measure that).
		Members:        1,
		MaxInFlight:    perfMaxInFlight,
		MaxPollRecords: perfMaxInFlight,
		ClientOptions:  append(c.KgoOpts(), perfFetchOpts...),
	}, nil)
	require.NoError(b, err)
	defer sub.Close()
	var answered atomic.Int64
	finished := make(chan struct{})
	handle := func(msg *message.Message) {
		got(recordIdx(msg.Payload))
		if answered.Add(1) == int64(n) {
			close(finished)
		}
	}
	if !router {
		msgs, err := sub.Subscribe(context.Background(), topic)
		require.NoError(b, err)
		go func() {
			for msg := range msgs {
				msg.Ack()
				handle(msg)
			}
		}()
		<-finished
		return
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	require.NoError(b, err)
	r.AddConsumerHandler("perf", topic, sub, func(msg *message.Message) error {
		handle(msg)
		return nil
	})
	go func() { _ = r.Run(context.Background()) }()
	<-finished
	_ = r.Close()
}

// shareBytesRead counts the bytes the bare kgo consumers read from brokers.
var shareBytesRead atomic.Int64

type shareReadBytes struct{}

func (shareReadBytes) OnBrokerRead(_ kgo.BrokerMetadata, _ int16, n int, _, _ time.Duration, _ error) {
	shareBytesRead.Add(int64(n))
}

func recordIdx(v []byte) int {
	if len(v) < 8 {
		return -1
	}
	return int(binary.BigEndian.Uint64(v))
}
