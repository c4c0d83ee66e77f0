// Command sink writes a Kafka topic into a database table, one row per
// record, with safeack.Batch: each batch of messages is one transaction,
// and a message is acked (its offset may be committed) only once the
// transaction holding its row committed. Rows are keyed by (topic,
// partition, offset) and written with INSERT ... ON CONFLICT DO NOTHING,
// so a record delivered again after a crash or a rebalance changes
// nothing: at-least-once delivery plus an idempotent write gives exactly
// one row per record.
//
// With no flags it starts an embedded Kafka-protocol broker (kfake),
// produces 10,000 records on 8 partitions, and writes them into the SQLite
// file sink.db (pure Go, no cgo):
//
//	go run ./examples/sink
//
// -brokers host:port,... (or SAFEACK_KAFKA_BROKERS, or KAFKA_BROKERS)
// reads a real cluster instead (then nothing is produced unless -produce
// says so); -postgres 'postgres://user:pass@host/db' writes into
// PostgreSQL through pgx. Every -stats-every it prints the rows written and
// the batches' sizes; SIGINT or SIGTERM closes it, which runs the batch
// being collected and commits.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
)

type config struct {
	brokers        []string
	topic, group   string
	partitions     int // of the embedded broker's topic
	produce        int // records to produce at start
	dbPath         string
	postgres       string
	batch          safeack.BatchConfig
	maxInFlight    int
	writeDelay     time.Duration
	statsEvery     time.Duration
	sessionTimeout time.Duration
	verbose        bool
	// -bench: measure instead (bench.go).
	bench           int
	benchDir        string
	benchPerMessage int
	benchTimeout    time.Duration
}

func parseFlags(args []string, getenv func(string) string) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("sink", flag.ContinueOnError)
	brokers := fs.String("brokers", cmp.Or(getenv("SAFEACK_KAFKA_BROKERS"), getenv("KAFKA_BROKERS")), "comma-separated `host:port` list of a Kafka cluster (default $SAFEACK_KAFKA_BROKERS, else $KAFKA_BROKERS; empty starts an embedded broker)")
	fs.StringVar(&cfg.topic, "topic", "events", "topic to read")
	fs.StringVar(&cfg.group, "group", "sink", "consumer group")
	fs.IntVar(&cfg.partitions, "partitions", 8, "partitions of the embedded broker's topic")
	produce := fs.Int("produce", -1, "records to produce at start (default 10000 on the embedded broker, 0 on a cluster)")
	fs.StringVar(&cfg.dbPath, "db", "sink.db", "SQLite file to write")
	fs.StringVar(&cfg.postgres, "postgres", "", "PostgreSQL `DSN` to write into instead of SQLite")
	fs.IntVar(&cfg.batch.MaxSize, "batch-size", 500, "most messages per batch (one transaction)")
	fs.DurationVar(&cfg.batch.MaxWait, "batch-wait", 100*time.Millisecond, "longest a batch's first message waits for more")
	maxInFlight := fs.Int("max-in-flight", 0, "messages handed out at once (default 2 x batch-size: one batch collects while one is written)")
	fs.DurationVar(&cfg.writeDelay, "write-delay", 0, "hold each transaction open this long before committing (a slow database)")
	fs.DurationVar(&cfg.statsEvery, "stats-every", 2*time.Second, "print progress this often (0: never)")
	fs.DurationVar(&cfg.sessionTimeout, "session-timeout", 10*time.Second, "consumer group session timeout: how long a killed sink holds its partitions")
	fs.BoolVar(&cfg.verbose, "v", false, "log the subscriber's and router's info lines")
	fs.IntVar(&cfg.bench, "bench", 0, "measure instead: `N` records into SQLite, per message and in batches, safeack and watermill-kafka (see bench.go)")
	fs.StringVar(&cfg.benchDir, "bench-dir", os.TempDir(), "-bench: directory of the SQLite files")
	fs.IntVar(&cfg.benchPerMessage, "bench-per-message", 0, "-bench: records the per-message contenders write (default all: at a few hundred rows/s they take long)")
	fs.DurationVar(&cfg.benchTimeout, "bench-timeout", 10*time.Minute, "-bench: longest a contender may take")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	for b := range strings.SplitSeq(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.brokers = append(cfg.brokers, b)
		}
	}
	cfg.produce = *produce
	if cfg.bench > 0 {
		cfg.produce = 0 // the bench produces its own
		if cfg.topic == "events" {
			cfg.topic = "sink-bench"
		}
	}
	if cfg.produce < 0 {
		cfg.produce = 0
		if len(cfg.brokers) == 0 {
			cfg.produce = 10_000
		}
	}
	cfg.maxInFlight = cmp.Or(*maxInFlight, 2*cfg.batch.MaxSize)
	if err := cfg.batch.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sink:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	runner := run
	if cfg.bench > 0 {
		runner = runBench
	}
	if err := runner(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sink:", err)
		os.Exit(1)
	}
}

// run sinks cfg.topic into the database until ctx ends.
func run(ctx context.Context, cfg config, out io.Writer) error {
	if len(cfg.brokers) == 0 {
		kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(cfg.partitions), cfg.topic))
		if err != nil {
			return fmt.Errorf("starting the embedded broker: %w", err)
		}
		defer kf.Close()
		cfg.brokers = kf.ListenAddrs()
		fmt.Fprintf(out, "embedded Kafka-protocol broker (kfake) on %s; topic %s with %d partitions\n", strings.Join(cfg.brokers, ","), cfg.topic, cfg.partitions)
	}
	if cfg.produce > 0 {
		if err := produce(cfg.brokers, cfg.topic, cfg.produce); err != nil {
			return err
		}
		fmt.Fprintf(out, "produced %d records to %s\n", cfg.produce, cfg.topic)
	}

	st, err := openStore(ctx, cfg.dbPath, cfg.postgres)
	if err != nil {
		return err
	}
	defer st.Close()
	st.delay = cfg.writeDelay
	where := "SQLite " + cfg.dbPath
	if cfg.postgres != "" {
		where = "PostgreSQL"
	}

	logger := watermill.LoggerAdapter(watermill.NopLogger{})
	if cfg.verbose {
		logger = watermill.NewStdLogger(false, false)
	}
	sc := safeack.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest // a sink wants the topic's history
	sc.Consumer.Group.Session.Timeout = cfg.sessionTimeout
	sc.Consumer.Group.Heartbeat.Interval = cfg.sessionTimeout / 3
	sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:       cfg.brokers,
		Unmarshaler:   kafka.DefaultMarshaler{},
		ConsumerGroup: cfg.group,
		// Rows are keyed by offset, so the order they are written in does
		// not matter: Unordered lets a batch take records of any key.
		// Under OrderByKey a batch would hold one record per key at most.
		Ordering:              safeack.Unordered,
		MaxInFlight:           cfg.maxInFlight,
		OverwriteSaramaConfig: sc,
	}, logger)
	if err != nil {
		return err
	}

	var rows atomic.Int64 // inserted by this process
	batcher, err := safeack.NewBatcher(cfg.batch, func(ctx context.Context, msgs []*message.Message) error {
		n, err := st.write(ctx, msgs)
		rows.Add(n)
		return err
	})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return err
	}
	// Per message: a batch that failed is retried message by message, each
	// joining a later batch. A database that stays down exhausts the
	// retries, and the message is nacked and delivered again: a sink never
	// dead-letters a record because its database was away.
	router.AddMiddleware(middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2}.Middleware)
	router.AddConsumerHandler("sink", cfg.topic, sub, batcher.Handler())
	fmt.Fprintf(out, "writing %s into %s in batches of up to %d\n", cfg.topic, where, cfg.batch.MaxSize)

	var last safeack.BatchStats
	progress := func(final bool) {
		bs := batcher.Stats()
		if !final && bs.Batches == last.Batches && bs.Collecting == last.Collecting {
			return // nothing new
		}
		last = bs
		total, err := st.count(context.Background(), cfg.topic)
		if err != nil {
			fmt.Fprintf(out, "counting rows: %v\n", err)
		}
		what := "progress"
		if final {
			what = "closed"
		}
		mean := 0.0
		if bs.Batches > 0 {
			mean = float64(bs.Messages) / float64(bs.Batches)
		}
		fmt.Fprintf(out, "%s: %d rows in the table, %d inserted here from %d messages in %d batches (mean size %.1f, last %d, largest %d), %d failed\n",
			what, total, rows.Load(), bs.Messages, bs.Batches, mean, bs.LastSize, bs.MaxSeen, bs.Failed)
	}
	if cfg.statsEvery > 0 {
		done := make(chan struct{})
		defer close(done)
		go func() {
			tick := time.NewTicker(cfg.statsEvery)
			defer tick.Stop()
			for {
				select {
				case <-tick.C:
					progress(false)
				case <-done:
					return
				}
			}
		}()
	}
	if err := router.Run(ctx); err != nil {
		return err
	}
	progress(true)
	return nil
}

// produce publishes n records to topic, keyed so that they spread over its
// partitions, in the format kafka.DefaultMarshaler reads.
func produce(brokers []string, topic string, n int) error {
	sc := sarama.NewConfig()
	sc.Producer.Return.Successes = true
	sc.Producer.Partitioner = sarama.NewHashPartitioner
	p, err := sarama.NewSyncProducer(brokers, sc)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer p.Close()
	var marshaler kafka.DefaultMarshaler
	const chunk = 1000
	for i := 0; i < n; i += chunk {
		batch := make([]*sarama.ProducerMessage, 0, chunk)
		for j := i; j < min(n, i+chunk); j++ {
			msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"event":%d}`, j))
			pm, err := marshaler.Marshal(topic, msg)
			if err != nil {
				return err
			}
			pm.Key = sarama.StringEncoder(fmt.Sprintf("key-%d", j))
			batch = append(batch, pm)
		}
		if err := p.SendMessages(batch); err != nil {
			return fmt.Errorf("producing: %w", err)
		}
	}
	return nil
}
