package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/metrics"
)

// keyMetadata is the Watermill metadata entry the producer's marshaler
// turns into the Kafka record key.
const keyMetadata = "order_key"

var (
	// errPoison is a handler's verdict on a record it can never process.
	errPoison = errors.New("order rejected: price list has no such product")
	// errFlaky is a passing failure (a timeout of a downstream call) that
	// a retry gets past.
	errFlaky = errors.New("downstream timed out")
)

// order is a produced record's payload.
type order struct {
	Seq      int64  `json:"seq"`
	Customer string `json:"customer"`
	Cents    int    `json:"amount_cents"`
	// Poison marks a record every handler run rejects: Retry gives up and
	// PoisonQueue moves it to the dead-letter topic.
	Poison bool `json:"poison,omitempty"`
}

// app is one run: the broker (when embedded), producer, router and its
// subscriber, the HTTP server and the counters they share.
type app struct {
	cfg     Config
	brokers []string
	logger  watermill.LoggerAdapter
	started time.Time
	marsh   kafka.MarshalerUnmarshaler
	tracing *tracing

	sub *safeack.Subscriber

	produced, produceErrors                atomic.Int64
	acked, nacked, skipped                 atomic.Int64
	deadLettered, failedAttempts, slowRuns atomic.Int64

	rates rateMeter

	reg          *prometheus.Registry
	handledVec   *prometheus.CounterVec
	handlerTime  prometheus.Histogram
	producedCtr  prometheus.CounterFunc
	deadCtr      prometheus.CounterFunc
	failedCtr    prometheus.CounterFunc
	slowRunsCtr  prometheus.CounterFunc
	producedErrs prometheus.CounterFunc
}

// run runs the example until ctx ends or cfg.Duration passes, then drains
// and returns. It returns an error only when something could not start.
func run(ctx context.Context, cfg Config) (err error) {
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	a := &app{
		cfg:     cfg,
		logger:  newLogger(cfg.Verbose),
		started: time.Now(),
		marsh: kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
			return msg.Metadata.Get(keyMetadata), nil
		}),
	}

	// The broker.
	a.brokers = cfg.Brokers
	if len(a.brokers) == 0 {
		kf, err := kfake.NewCluster(
			kfake.NumBrokers(1),
			kfake.SeedTopics(int32(cfg.Partitions), cfg.Topic),
			kfake.SeedTopics(1, cfg.DeadLetterTopic),
		)
		if err != nil {
			return fmt.Errorf("starting the embedded broker: %w", err)
		}
		defer kf.Close()
		a.brokers = kf.ListenAddrs()
		a.printf("embedded Kafka-protocol broker (kfake) on %s; topic %s with %d partitions\n", strings.Join(a.brokers, ","), cfg.Topic, cfg.Partitions)
	} else {
		if err := a.ensureTopics(); err != nil {
			return err
		}
		a.printf("Kafka cluster %s; topic %s\n", strings.Join(a.brokers, ","), cfg.Topic)
	}

	// Tracing, when asked for.
	if a.tracing, err = newTracing(cfg.TraceOut); err != nil {
		return err
	}
	defer a.tracing.shutdown(context.Background())
	obs, err := a.tracing.observer()
	if err != nil {
		return err
	}

	// The subscriber, the router and its middleware.
	a.sub, err = safeack.NewSubscriber(safeack.SubscriberConfig{
		Brokers:               a.brokers,
		Unmarshaler:           a.marsh,
		OverwriteSaramaConfig: a.subscriberSaramaConfig(),
		ConsumerGroup:         cfg.Group,
		Ordering:              cfg.Ordering,
		MaxInFlight:           cfg.MaxInFlight,
		CommitInterval:        cfg.CommitInterval,
		NackResendSleep:       50 * time.Millisecond,
		DrainTimeout:          5 * time.Second,
		Observer:              observerOrNil(obs),
	}, a.logger)
	if err != nil {
		return err
	}
	defer a.sub.Close()

	dlq, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               a.brokers,
		Marshaler:             kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: a.producerSaramaConfig(true),
	}, a.logger)
	if err != nil {
		return fmt.Errorf("dead-letter publisher: %w", err)
	}
	defer dlq.Close()

	router, err := a.newRouter(&countingPublisher{Publisher: dlq, n: &a.deadLettered})
	if err != nil {
		return err
	}
	a.registerMetrics()

	// The HTTP server.
	var srv *http.Server
	if cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("listening on %s: %w", cfg.HTTPAddr, err)
		}
		srv = &http.Server{Handler: a.httpHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.logger.Error("HTTP server stopped", err, nil)
			}
		}()
		a.printf("live page: http://%s/   metrics: http://%s/metrics\n", ln.Addr(), ln.Addr())
		if cfg.OnListen != nil {
			cfg.OnListen(ln.Addr().String())
		}
	}

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.Background()) }()

	// The producer runs until ctx ends.
	prodCtx, stopProducing := context.WithCancel(ctx)
	producerDone := make(chan error, 1)
	go func() { producerDone <- a.produce(prodCtx) }()

	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		a.progress(stopProgress)
	}()

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-routerDone:
		runErr = fmt.Errorf("router stopped: %w", err)
		routerDone <- nil
	case err := <-producerDone:
		if err != nil {
			runErr = fmt.Errorf("producer stopped: %w", err)
		}
		producerDone <- nil
	}

	// Drain: stop producing, close the router (it closes the subscriber,
	// which stops handing out records, cancels the contexts of those in
	// flight, waits for their acks and commits the completed prefixes),
	// then report where the group ended.
	close(stopProgress)
	<-progressDone
	a.printf("stopping: draining in-flight records and committing completed prefixes\n")
	stopProducing()
	if err := <-producerDone; err != nil && runErr == nil {
		runErr = fmt.Errorf("producer: %w", err)
	}
	if err := router.Close(); err != nil {
		a.logger.Error("Router close", err, nil)
	}
	<-routerDone
	_ = a.sub.Close()
	a.finalReport()
	if srv != nil {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(shutdownCtx)
		cancel()
	}
	return runErr
}

func (a *app) printf(format string, args ...any) {
	if a.cfg.Out != nil {
		fmt.Fprintf(a.cfg.Out, format, args...)
	}
}

func (a *app) baseSaramaConfig() *sarama.Config {
	sc := sarama.NewConfig()
	sc.Version = a.cfg.KafkaVersion
	sc.ClientID = "safeack-demo"
	sc.Metadata.Retry.Backoff = 100 * time.Millisecond
	return sc
}

func (a *app) subscriberSaramaConfig() *sarama.Config {
	sc := a.baseSaramaConfig()
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.MaxWaitTime = 100 * time.Millisecond
	sc.Consumer.Group.Rebalance.Retry.Backoff = 200 * time.Millisecond
	return sc
}

func (a *app) producerSaramaConfig(sync bool) *sarama.Config {
	sc := a.baseSaramaConfig()
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	sc.Producer.RequiredAcks = sarama.WaitForLocal
	sc.Producer.Retry.Max = 10
	sc.Producer.Partitioner = sarama.NewHashPartitioner
	if !sync {
		sc.Producer.Flush.Frequency = 5 * time.Millisecond
	}
	return sc
}

// ensureTopics creates the topic and the dead-letter topic on a real
// cluster when they do not exist.
func (a *app) ensureTopics() error {
	admin, err := sarama.NewClusterAdmin(a.brokers, a.baseSaramaConfig())
	if err != nil {
		return fmt.Errorf("connecting to %v: %w", a.brokers, err)
	}
	defer admin.Close()
	for _, t := range []struct {
		name       string
		partitions int32
	}{{a.cfg.Topic, int32(a.cfg.Partitions)}, {a.cfg.DeadLetterTopic, 1}} {
		err := admin.CreateTopic(t.name, &sarama.TopicDetail{NumPartitions: t.partitions, ReplicationFactor: -1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) && !strings.Contains(err.Error(), "already exists") {
			return fmt.Errorf("creating topic %s: %w", t.name, err)
		}
	}
	return nil
}

// newRouter builds the router: safeack's middleware (its PoisonQueue
// among them) around Watermill's Retry and Recoverer, in the order
// middleware.go documents.
func (a *app) newRouter(dlq message.Publisher) (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 15 * time.Second}, a.logger)
	if err != nil {
		return nil, err
	}
	// Only real failures go to the dead-letter topic: safeack's
	// PoisonQueue nacks a record whose handler was cut short because the
	// subscriber is closing (or its partition was revoked), and that record
	// is left uncommitted for whoever consumes the partition next.
	poison, err := safeack.PoisonQueue(dlq, a.cfg.DeadLetterTopic)
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(
		safeack.Telemetry(a.observe),
		safeack.SkipRevoked,
		safeack.KafkaMetadata,
		poison,
		middleware.Retry{
			MaxRetries:      3,
			InitialInterval: 20 * time.Millisecond,
			MaxInterval:     200 * time.Millisecond,
			Multiplier:      2,
			ShouldRetry: func(p middleware.RetryParams) bool {
				if errors.Is(p.Err, context.Canceled) {
					return false // the subscriber is closing: no point
				}
				a.failedAttempts.Add(1)
				return true
			},
		}.Middleware,
		middleware.Recoverer,
	)
	router.AddConsumerHandler("orders", a.cfg.Topic, a.sub, a.handle)
	return router, nil
}

// observe is the Telemetry hook: one call per handler run, after the
// dead-letter decision (a dead-lettered record is acked: handled).
func (a *app) observe(ev safeack.CompletionEvent) {
	outcome := ev.Outcome.String()
	switch ev.Outcome {
	case safeack.OutcomeAck, safeack.OutcomeDeferred, safeack.OutcomeDeadLettered:
		a.acked.Add(1)
	case safeack.OutcomeNack:
		a.nacked.Add(1)
	case safeack.OutcomeSkipped:
		a.skipped.Add(1)
	}
	if a.handledVec != nil {
		a.handledVec.WithLabelValues(outcome).Inc()
		a.handlerTime.Observe(ev.Duration.Seconds())
	}
}

// handle is the business handler: it works for a random while, now and
// then for seconds (a slow downstream call: its partition's commit waits
// for it, while the records after it keep completing), fails now and then
// (Retry gets past it), and rejects poison records, half of them with a
// panic (Recoverer turns it into an error; after the retries PoisonQueue
// moves the record to the dead-letter topic).
func (a *app) handle(msg *message.Message) (err error) {
	end := a.tracing.handling(msg.Context())
	defer func() { end(err) }()
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return fmt.Errorf("%w: payload is not an order: %v", errPoison, err)
	}
	work := a.cfg.MinLatency
	if d := a.cfg.MaxLatency - a.cfg.MinLatency; d > 0 {
		work += rand.N(d)
	}
	if a.cfg.SlowRate > 0 && rand.Float64() < a.cfg.SlowRate {
		work = a.cfg.SlowLatency
		a.slowRuns.Add(1)
	}
	t := time.NewTimer(work)
	select {
	case <-t.C:
	case <-msg.Context().Done():
		t.Stop()
		return msg.Context().Err()
	}
	if o.Poison {
		if o.Seq%2 == 0 {
			panic(fmt.Sprintf("order %d: %v", o.Seq, errPoison))
		}
		return fmt.Errorf("order %d: %w", o.Seq, errPoison)
	}
	if a.cfg.FlakyRate > 0 && rand.Float64() < a.cfg.FlakyRate {
		return fmt.Errorf("order %d: %w", o.Seq, errFlaky)
	}
	return nil
}

// produce sends a steady stream of keyed orders at cfg.Rate per second
// until ctx ends, then flushes.
func (a *app) produce(ctx context.Context) error {
	if a.cfg.Rate == 0 {
		<-ctx.Done()
		return nil
	}
	p, err := sarama.NewAsyncProducer(a.brokers, a.producerSaramaConfig(false))
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for range p.Successes() {
			a.produced.Add(1)
		}
	}()
	go func() {
		defer wg.Done()
		for err := range p.Errors() {
			if a.produceErrors.Add(1) <= 3 {
				a.logger.Error("Produce failed", err, nil)
			}
		}
	}()
	defer func() {
		p.AsyncClose()
		wg.Wait()
	}()

	start := time.Now()
	var sent int64
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		due := int64(time.Since(start).Seconds() * float64(a.cfg.Rate))
		if due-sent > int64(a.cfg.Rate) {
			sent = due - int64(a.cfg.Rate) // fell behind by more than a second: do not burst
		}
		for ; sent < due; sent++ {
			pm, err := a.newOrder(sent)
			if err != nil {
				return err
			}
			select {
			case p.Input() <- pm:
			case <-ctx.Done():
				return nil
			}
		}
	}
}

func (a *app) newOrder(seq int64) (*sarama.ProducerMessage, error) {
	o := order{
		Seq:      seq,
		Customer: fmt.Sprintf("customer-%04d", rand.IntN(a.cfg.Keys)),
		Cents:    100 + rand.IntN(20000),
		Poison:   a.cfg.PoisonRate > 0 && rand.Float64() < a.cfg.PoisonRate,
	}
	payload, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(keyMetadata, o.Customer)
	pm, err := a.marsh.Marshal(a.cfg.Topic, msg)
	if err == nil {
		a.tracing.produced(pm)
	}
	return pm, err
}

// countingPublisher counts the messages published through it.
type countingPublisher struct {
	message.Publisher
	n *atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	p.n.Add(int64(len(msgs)))
	return nil
}

// finalReport prints where the group's commits ended, read back from the
// broker, against the end of each partition.
func (a *app) finalReport() {
	a.printf("handled %d records (%d dead-lettered, %d failed attempts retried or dead-lettered, %d slow runs); %d produced\n",
		a.acked.Load(), a.deadLettered.Load(), a.failedAttempts.Load(), a.slowRuns.Load(), a.produced.Load())
	client, err := sarama.NewClient(a.brokers, a.baseSaramaConfig())
	if err != nil {
		return
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return
	}
	parts, err := client.Partitions(a.cfg.Topic)
	if err != nil {
		return
	}
	resp, err := admin.ListConsumerGroupOffsets(a.cfg.Group, map[string][]int32{a.cfg.Topic: parts})
	if err != nil {
		return
	}
	var b strings.Builder
	var left int64
	for _, p := range parts {
		end, err := client.GetOffset(a.cfg.Topic, p, sarama.OffsetNewest)
		if err != nil {
			return
		}
		committed := int64(-1)
		if blk := resp.GetBlock(a.cfg.Topic, p); blk != nil && blk.Err == sarama.ErrNoError {
			committed = blk.Offset
		}
		fmt.Fprintf(&b, " p%d %d/%d", p, committed, end)
		if committed >= 0 {
			left += end - committed
		} else {
			left += end
		}
	}
	a.printf("committed/end of log:%s\n%d records past the commits: the next run handles them, except those the commit metadata lists as completed\n", b.String(), left)
}

// newLogger logs errors only, unless verbose.
func newLogger(verbose bool) watermill.LoggerAdapter {
	if verbose {
		return watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	}
	return errorsOnly{watermill.NewStdLoggerWithOut(os.Stderr, false, false)}
}

type errorsOnly struct{ watermill.LoggerAdapter }

func (l errorsOnly) Info(string, watermill.LogFields)  {}
func (l errorsOnly) Debug(string, watermill.LogFields) {}
func (l errorsOnly) Trace(string, watermill.LogFields) {}
func (l errorsOnly) With(f watermill.LogFields) watermill.LoggerAdapter {
	return errorsOnly{l.LoggerAdapter.With(f)}
}

// registerMetrics builds the Prometheus registry: safeack's collector, the
// example's own counters, and the Go runtime's.
func (a *app) registerMetrics() {
	a.reg = prometheus.NewRegistry()
	a.handledVec = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "safeack_demo", Name: "handler_runs_total",
		Help: "Handler runs by outcome (dead-lettered: published to the dead-letter topic, then acked; nack is a failure after retries that will be redelivered).",
	}, []string{"outcome"})
	a.handlerTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "safeack_demo", Name: "handler_duration_seconds",
		Help:    "Time a handler run took, retries and dead-lettering included.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
	counter := func(name, help string, v *atomic.Int64) prometheus.CounterFunc {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "safeack_demo", Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	a.producedCtr = counter("produced_records_total", "Records the producer got acknowledged.", &a.produced)
	a.producedErrs = counter("produce_errors_total", "Records the producer failed to produce.", &a.produceErrors)
	a.deadCtr = counter("dead_lettered_records_total", "Records published to the dead-letter topic.", &a.deadLettered)
	a.failedCtr = counter("failed_attempts_total", "Handler attempts that failed; middleware.Retry retries each up to 3 times, then PoisonQueue dead-letters the record.", &a.failedAttempts)
	a.slowRunsCtr = counter("slow_runs_total", "Handler runs that took the slow latency.", &a.slowRuns)
	a.reg.MustRegister(
		metrics.NewCollector(a.sub),
		a.handledVec, a.handlerTime,
		a.producedCtr, a.producedErrs, a.deadCtr, a.failedCtr, a.slowRunsCtr,
		collectors.NewGoCollector(),
	)
}
