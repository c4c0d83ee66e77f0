package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

// The -bench mode: the same records written into a fresh SQLite file by
// each contender in turn (then into PostgreSQL, with -postgres), one
// invocation, one broker. It reports rows/s
// (records over the time from the router's start to the last row's
// commit) and the end lag (last row committed in the database -> the
// group's committed offsets at every partition's end, polled every 5 ms).

type benchContender struct {
	name string
	// start runs the contender's router until ctx ends; onRows is called
	// with the rows each transaction inserted, after it committed.
	start func(ctx context.Context, brokers []string, topic, group string, st *store, onRows func(int64)) (*message.Router, error)
	limit int // records it is given time for (0: all)
}

func runBench(ctx context.Context, cfg config, out io.Writer) error {
	if len(cfg.brokers) == 0 {
		kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(cfg.partitions), cfg.topic))
		if err != nil {
			return fmt.Errorf("starting the embedded broker: %w", err)
		}
		defer kf.Close()
		cfg.brokers = kf.ListenAddrs()
	}
	if err := produce(cfg.brokers, cfg.topic, cfg.bench); err != nil {
		return err
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(out, "sink bench: %d records on %d partitions, SQLite files in %s (WAL, synchronous FULL); %d CPUs, %s/%s, %s; load average %s\n",
		cfg.bench, cfg.partitions, cfg.benchDir, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), strings.TrimSpace(string(load)))

	contenders := []benchContender{
		{name: "safeack, a transaction per message, MaxInFlight 64", start: safeackPerMessage(64), limit: cfg.benchPerMessage},
		{name: "safeack Batch 100, MaxInFlight 200", start: safeackBatch(100)},
		{name: "safeack Batch 1000, MaxInFlight 2000", start: safeackBatch(1000)},
		{name: "watermill-kafka v3.1.4, a transaction per message", start: wmKafkaPerMessage, limit: cfg.benchPerMessage},
	}
	dbs := []string{""}
	if cfg.postgres != "" {
		dbs = append(dbs, cfg.postgres)
	}
	for _, dsn := range dbs {
		what := "SQLite"
		if dsn != "" {
			what = "PostgreSQL"
		}
		fmt.Fprintf(out, "-- %s\n", what)
		for i, c := range contenders {
			if err := benchOne(ctx, cfg, out, c, dsn, fmt.Sprintf("sink-bench-%d-%d", time.Now().UnixNano(), i)); err != nil {
				return fmt.Errorf("%s into %s: %w", c.name, what, err)
			}
		}
	}
	return nil
}

// benchOne runs c into a fresh SQLite file, or into PostgreSQL at dsn
// (its table emptied first).
func benchOne(ctx context.Context, cfg config, out io.Writer, c benchContender, dsn, group string) error {
	path := filepath.Join(cfg.benchDir, group+".db")
	defer func() {
		for _, suffix := range []string{"", "-wal", "-shm"} {
			_ = os.Remove(path + suffix)
		}
	}()
	st, err := openStore(ctx, path, dsn)
	if err != nil {
		return err
	}
	defer st.Close()
	if dsn != "" {
		if _, err := st.db.ExecContext(ctx, "TRUNCATE sink_records"); err != nil {
			return err
		}
	}

	want := int64(cfg.bench)
	if c.limit > 0 && c.limit < cfg.bench {
		want = int64(c.limit)
	}
	var rows atomic.Int64
	lastRow := make(chan time.Time, 1)
	onRows := func(n int64) {
		if total := rows.Add(n); total >= want && total-n < want {
			lastRow <- time.Now()
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	router, err := c.start(runCtx, cfg.brokers, cfg.topic, group, st, onRows)
	if err != nil {
		return err
	}
	runDone := make(chan error, 1)
	go func() { runDone <- router.Run(runCtx) }()
	<-router.Running()
	start := time.Now()

	var end time.Time
	select {
	case end = <-lastRow:
	case <-time.After(cfg.benchTimeout):
		return fmt.Errorf("%d of %d rows after %v", rows.Load(), want, cfg.benchTimeout)
	case err := <-runDone:
		return fmt.Errorf("the router stopped: %v", err)
	}
	took := end.Sub(start)
	rate := float64(want) / took.Seconds()

	lag := "n/a (a part of the topic)"
	if want == int64(cfg.bench) {
		d, err := commitLag(cfg.brokers, cfg.topic, group, end, cfg.benchTimeout)
		if err != nil {
			lag = err.Error()
		} else {
			lag = d.Round(time.Millisecond).String()
		}
	}
	fmt.Fprintf(out, "%-52s %8d rows in %8.2f s: %9.0f rows/s; last row -> committed: %s\n", c.name, want, took.Seconds(), rate, lag)
	cancel()
	<-runDone
	return nil
}

// commitLag polls the group's committed offsets until every partition is
// at its end, and returns the time from lastRow.
func commitLag(brokers []string, topic, group string, lastRow time.Time, timeout time.Duration) (time.Duration, error) {
	sc := sarama.NewConfig()
	client, err := sarama.NewClient(brokers, sc)
	if err != nil {
		return 0, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, err
	}
	parts, err := client.Partitions(topic)
	if err != nil {
		return 0, err
	}
	ends := map[int32]int64{}
	for _, p := range parts {
		if ends[p], err = client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			return 0, err
		}
	}
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
		if err != nil {
			continue
		}
		all := true
		for _, p := range parts {
			if b := resp.GetBlock(topic, p); b == nil || b.Offset < ends[p] {
				all = false
				break
			}
		}
		if all {
			return time.Since(lastRow), nil
		}
	}
	return 0, fmt.Errorf("not committed within %v", timeout)
}

func benchSaramaConfig() *sarama.Config {
	sc := safeack.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	return sc
}

func newBenchRouter() (*message.Router, error) {
	return message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
}

func safeackSub(brokers []string, group string, maxInFlight int) (*safeack.Subscriber, error) {
	return safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		Ordering:              safeack.Unordered,
		MaxInFlight:           maxInFlight,
		OverwriteSaramaConfig: benchSaramaConfig(),
	}, nil)
}

func safeackPerMessage(maxInFlight int) func(context.Context, []string, string, string, *store, func(int64)) (*message.Router, error) {
	return func(_ context.Context, brokers []string, topic, group string, st *store, onRows func(int64)) (*message.Router, error) {
		sub, err := safeackSub(brokers, group, maxInFlight)
		if err != nil {
			return nil, err
		}
		router, err := newBenchRouter()
		if err != nil {
			return nil, err
		}
		router.AddConsumerHandler("sink", topic, sub, func(msg *message.Message) error {
			n, err := st.write(msg.Context(), []*message.Message{msg})
			onRows(n)
			return err
		})
		return router, nil
	}
}

func safeackBatch(size int) func(context.Context, []string, string, string, *store, func(int64)) (*message.Router, error) {
	return func(_ context.Context, brokers []string, topic, group string, st *store, onRows func(int64)) (*message.Router, error) {
		sub, err := safeackSub(brokers, group, 2*size)
		if err != nil {
			return nil, err
		}
		router, err := newBenchRouter()
		if err != nil {
			return nil, err
		}
		router.AddConsumerHandler("sink", topic, sub, safeack.Batch(safeack.BatchConfig{MaxSize: size}, func(ctx context.Context, msgs []*message.Message) error {
			n, err := st.write(ctx, msgs)
			onRows(n)
			return err
		}))
		return router, nil
	}
}

// wmKafkaPerMessage is watermill-kafka's subscriber, one message per
// partition in flight, each written in its own transaction. Its messages
// carry their position in watermill-kafka's context helpers.
func wmKafkaPerMessage(_ context.Context, brokers []string, topic, group string, st *store, onRows func(int64)) (*message.Router, error) {
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		OverwriteSaramaConfig: benchSaramaConfig(),
	}, nil)
	if err != nil {
		return nil, err
	}
	router, err := newBenchRouter()
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("sink", topic, sub, func(msg *message.Message) error {
		partition, _ := kafka.MessagePartitionFromCtx(msg.Context())
		offset, _ := kafka.MessagePartitionOffsetFromCtx(msg.Context())
		key, _ := kafka.MessageKeyFromCtx(msg.Context())
		n, err := st.insert(msg.Context(), []any{topic, partition, offset, key, []byte(msg.Payload), msg.UUID})
		onRows(n)
		return err
	})
	return router, nil
}
