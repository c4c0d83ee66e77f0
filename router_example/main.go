// Command router_example is safeack's showcase: a Watermill router that
// consumes a keyed Kafka topic through a safeack Subscriber, with handlers
// of random latency, an occasional slow record that holds its partition's
// commit back for seconds, and poison records that Retry gives up on and
// PoisonQueue moves to a dead-letter topic. It serves Prometheus metrics and
// a live page that draws, per partition, the committed offset, the
// completed prefix, the completed records blocked behind a slow one and the
// unfinished ones.
//
// With no flags it starts an embedded Kafka-protocol broker (kfake) on
// loopback, so it needs nothing installed:
//
//	go run ./router_example
//	open http://127.0.0.1:8080/
//
// -brokers host:port,... (or SAFEACK_KAFKA_BROKERS, which scripts/kafka.sh
// start prints, or KAFKA_BROKERS) uses a real cluster instead; the topics are
// created when missing. It stops on SIGINT or SIGTERM, or after
// -duration, draining the records in flight.
//
// It exports no traces by default; -trace-stdout prints OpenTelemetry spans
// to standard output (package github.com/safeack/safeack/otel): each
// record's send, its delivery (linked to the send), the handler's span
// inside it, and the commits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/safeack/safeack"
)

// Config is everything run needs; main fills it from flags.
type Config struct {
	// Brokers of a real cluster; empty starts the embedded broker.
	Brokers      []string
	KafkaVersion sarama.KafkaVersion

	Topic, DeadLetterTopic, Group string
	Partitions                    int // of the topic, when it is created here

	Rate int // records produced per second; 0 produces nothing
	Keys int // distinct record keys

	MinLatency, MaxLatency time.Duration // a handler's usual work
	SlowRate               float64       // fraction of handler runs that take SlowLatency
	SlowLatency            time.Duration
	PoisonRate             float64 // fraction of records that always fail (dead-lettered)
	FlakyRate              float64 // fraction of handler runs that fail once (retried)

	Ordering       safeack.Ordering
	MaxInFlight    int
	CommitInterval time.Duration

	Duration time.Duration // 0 runs until ctx ends
	HTTPAddr string        // "" serves nothing

	// Out receives the progress lines (nil: none). Verbose adds
	// Watermill's and safeack's logs on stderr.
	Out     io.Writer
	Verbose bool
	// TraceOut, when set, receives every span as JSON (-trace-stdout:
	// standard output); nil traces nothing.
	TraceOut io.Writer
	// OnListen, when set, is told the HTTP address once it listens.
	OnListen func(addr string)
}

// DefaultConfig is the configuration of a plain `go run ./router_example`.
func DefaultConfig() Config {
	return Config{
		KafkaVersion:    sarama.V4_1_0_0,
		Topic:           "safeack-demo-orders",
		DeadLetterTopic: "safeack-demo-orders.dlq",
		Group:           "safeack-demo",
		Partitions:      6,
		Rate:            300,
		Keys:            1000,
		MinLatency:      5 * time.Millisecond,
		MaxLatency:      80 * time.Millisecond,
		SlowRate:        0.002,
		SlowLatency:     4 * time.Second,
		PoisonRate:      0.002,
		FlakyRate:       0.01,
		Ordering:        safeack.OrderByKey,
		MaxInFlight:     256,
		CommitInterval:  500 * time.Millisecond,
		HTTPAddr:        "127.0.0.1:8080",
		Out:             os.Stdout,
	}
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Getenv)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "router_example:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "router_example:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, getenv func(string) string) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("router_example", flag.ContinueOnError)
	brokers := fs.String("brokers", brokersFromEnv(getenv), "comma-separated `host:port` list of a real Kafka cluster (default $SAFEACK_KAFKA_BROKERS, else $KAFKA_BROKERS; empty starts an embedded broker)")
	version := fs.String("kafka-version", cfg.KafkaVersion.String(), "Kafka `version` Sarama assumes (it negotiates down through ApiVersions)")
	fs.StringVar(&cfg.Topic, "topic", cfg.Topic, "topic to produce to and consume")
	fs.StringVar(&cfg.DeadLetterTopic, "dlq", cfg.DeadLetterTopic, "dead-letter topic for records that keep failing")
	fs.StringVar(&cfg.Group, "group", cfg.Group, "consumer group")
	fs.IntVar(&cfg.Partitions, "partitions", cfg.Partitions, "partitions of the topic when it is created here")
	fs.IntVar(&cfg.Rate, "rate", cfg.Rate, "records produced per second (0: none)")
	fs.IntVar(&cfg.Keys, "keys", cfg.Keys, "distinct record keys")
	fs.DurationVar(&cfg.MinLatency, "min-latency", cfg.MinLatency, "shortest handler work")
	fs.DurationVar(&cfg.MaxLatency, "max-latency", cfg.MaxLatency, "longest usual handler work")
	fs.Float64Var(&cfg.SlowRate, "slow-rate", cfg.SlowRate, "fraction of handler runs that are slow")
	fs.DurationVar(&cfg.SlowLatency, "slow", cfg.SlowLatency, "how long a slow handler run takes")
	fs.Float64Var(&cfg.PoisonRate, "poison-rate", cfg.PoisonRate, "fraction of records that always fail and go to the dead-letter topic")
	fs.Float64Var(&cfg.FlakyRate, "flaky-rate", cfg.FlakyRate, "fraction of handler runs that fail and are retried")
	ordering := fs.String("ordering", "key", "ordering mode: key, partition or unordered")
	fs.IntVar(&cfg.MaxInFlight, "max-in-flight", cfg.MaxInFlight, fmt.Sprintf("messages handed to handlers at once (the router's concurrency); 0 means safeack's default, %d", safeack.DefaultMaxInFlight))
	fs.DurationVar(&cfg.CommitInterval, "commit-interval", cfg.CommitInterval, "how often completed prefixes are committed (safeack.SubscriberConfig.CommitInterval; 0: Sarama's auto-commit interval, 1 s)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "stop after this long (0: run until SIGINT/SIGTERM)")
	fs.StringVar(&cfg.HTTPAddr, "http", cfg.HTTPAddr, "`address` of the live page and /metrics (empty: none)")
	fs.BoolVar(&cfg.Verbose, "v", false, "log Watermill and safeack messages to stderr")
	traceStdout := fs.Bool("trace-stdout", false, "print OpenTelemetry spans (producer, delivery, handler, commit) to stdout as JSON; try it with -rate 2")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, b := range strings.Split(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.Brokers = append(cfg.Brokers, b)
		}
	}
	v, err := sarama.ParseKafkaVersion(*version)
	if err != nil {
		return cfg, fmt.Errorf("-kafka-version: %w", err)
	}
	cfg.KafkaVersion = v
	if *traceStdout {
		cfg.TraceOut = os.Stdout
	}
	switch *ordering {
	case "key":
		cfg.Ordering = safeack.OrderByKey
	case "partition":
		cfg.Ordering = safeack.OrderByPartition
	case "unordered":
		cfg.Ordering = safeack.Unordered
	default:
		return cfg, fmt.Errorf("-ordering %q: want key, partition or unordered", *ordering)
	}
	return cfg, cfg.validate()
}

// brokersFromEnv returns the brokers the environment names: the variable
// the README, the test suite and scripts/kafka.sh use, or, when it is
// unset, the one this example read before.
func brokersFromEnv(getenv func(string) string) string {
	if b := getenv("SAFEACK_KAFKA_BROKERS"); b != "" {
		return b
	}
	return getenv("KAFKA_BROKERS")
}

func (c Config) validate() error {
	switch {
	case c.Topic == "" || c.DeadLetterTopic == "" || c.Group == "":
		return errors.New("topic, dead-letter topic and group must be named")
	case c.Topic == c.DeadLetterTopic:
		return errors.New("the dead-letter topic must differ from the topic")
	case c.Partitions < 1:
		return fmt.Errorf("partitions %d: need at least one", c.Partitions)
	case c.Rate < 0 || c.Keys < 1:
		return fmt.Errorf("rate %d and keys %d: need rate >= 0 and keys >= 1", c.Rate, c.Keys)
	case c.MinLatency < 0 || c.MaxLatency < c.MinLatency || c.SlowLatency < 0:
		return errors.New("latencies: need 0 <= min-latency <= max-latency and slow >= 0")
	case !fraction(c.SlowRate) || !fraction(c.PoisonRate) || !fraction(c.FlakyRate):
		return errors.New("slow-rate, poison-rate and flaky-rate are fractions between 0 and 1")
	case c.Duration < 0:
		return errors.New("duration must not be negative")
	}
	return nil
}

func fraction(f float64) bool { return f >= 0 && f <= 1 }
