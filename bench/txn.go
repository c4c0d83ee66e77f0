package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack"
)

// Contender kinds of the txn-router workload: a consume-transform-produce
// router with one output per input.
const (
	txnAtLeastOnce = "safeack/at-least-once" // safeack subscriber, watermill-kafka publisher
	txnExactlyOnce = "safeack/txn"           // safeack subscriber, safeack.TxnPublisher
	txnWatermill   = "wm-kafka"              // watermill-kafka subscriber and publisher
)

// txnRouter is issue 15's workload: the transactional path beside the
// at-least-once one and watermill-kafka, 2 ms handlers, one output per
// input, on 1 and 8 partitions.
func txnRouter() *workload {
	n := quick(20_000, 4_000)
	const conc = 256
	w := &workload{
		name: "txn-router",
		desc: fmt.Sprintf("consume-transform-produce router: %d records, handler sleeps 2 ms and returns one output, MaxInFlight %d, transaction interval %s", n, conc, opt.txnInterval),
		cols: []string{"wall", "rate", "x:vs_alo", "cpu", "cpupm", "x:txns", "x:commit_ms", "x:commit_max_ms", "x:during_commit", "x:endlag_s"},
		run:  runTxnRouter,
		notes: []string{
			"wall = router start → every input acked (safeack/txn: → every output in a committed transaction, i.e. the group's offsets at the end); rate = records / wall.",
			"vs_alo = rate over the at-least-once row of the same partition count.",
			"txns = transactions committed; commit_ms = mean time to write and commit one (outputs, TxnOffsetCommit, EndTxn), commit_max_ms its maximum; during_commit = share of acks taken while a transaction was committing (handlers are not stopped for commits).",
			"endlag_s = last ack → the group's committed offsets at the end of every partition.",
			"Outputs go to a topic with as many partitions as the input, keyless (hash partitioner spreads them).",
		},
	}
	for _, parts := range []int{1, 8} {
		t := &topicSpec{name: fmt.Sprintf("txn-p%d", parts), partitions: parts, n: n, valueSize: valueSize, keys: 0}
		for _, label := range []string{txnAtLeastOnce, txnExactlyOnce, txnWatermill} {
			w.cases = append(w.cases, &caseSpec{label: fmt.Sprintf("%s p=%d", label, parts), topic: t, conc: conc,
				settings: map[string]string{"kind": label}})
		}
	}
	return w
}

func runTxnRouter(ctx context.Context, env *brokerEnv, w *workload) (*section, error) {
	sec := newSection(w)
	alo := map[int]float64{}
	failed, err := repeatCases(ctx, sec, selectedOnly(w), 30, func(c *caseSpec, rep int) (*result, error) {
		t, err := env.topicFor(ctx, c.topic)
		if err != nil {
			return nil, err
		}
		settle()
		r := txnRouterOnce(ctx, env, w, c, t, rep)
		if r.err == nil {
			if c.settings["kind"] == txnAtLeastOnce {
				alo[c.topic.partitions] = r.rate()
			}
			if base := alo[c.topic.partitions]; base > 0 {
				r.extra["vs_alo"] = r.rate() / base
			}
		}
		return r, nil
	}, func(r *result) string {
		return fmt.Sprintf("wall %.3fs rate %.0f/s cpu %.2fs txns %.0f commit %.1fms (max %.1fms) endlag %.3fs",
			r.wall.Seconds(), r.rate(), r.cpu.Seconds(), r.extra["txns"], r.extra["commit_ms"], r.extra["commit_max_ms"], r.extra["endlag_s"])
	})
	if err != nil {
		return sec, err
	}
	return sec, failed
}

func txnRouterOnce(ctx context.Context, env *brokerEnv, w *workload, c *caseSpec, t *topic, rep int) *result {
	r := &result{n: c.topic.n, retained: -1, commit: -1, endLag: -1, extra: map[string]float64{}}
	kind := c.settings["kind"]
	group := groupName(env, w.name, c.label, rep)
	out := group + ".out"
	if err := env.createTopic(ctx, out, c.topic.partitions); err != nil {
		r.err = err
		return r
	}
	var acked atomic.Int64
	allAcked := make(chan struct{})
	handler := func(msg *message.Message) ([]*message.Message, error) {
		time.Sleep(2 * time.Millisecond)
		o := message.NewMessage(msg.UUID, msg.Payload)
		if acked.Add(1) == int64(c.topic.n) {
			close(allAcked)
		}
		return []*message.Message{o}, nil
	}

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, nil)
	if err != nil {
		r.err = err
		return r
	}
	var sub message.Subscriber
	var pub message.Publisher
	var txnPub *safeack.TxnPublisher
	switch kind {
	case txnWatermill:
		s, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
			Brokers: env.brokers, Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: consumerConfig(), ConsumerGroup: group,
		}, nil)
		if err != nil {
			r.err = err
			return r
		}
		sub = s
	default:
		cfg := safeack.SubscriberConfig{
			Brokers: env.brokers, OverwriteSaramaConfig: consumerConfig(), ConsumerGroup: group,
			MaxInFlight: c.conc, Ordering: safeack.Unordered,
		}
		if kind != txnExactlyOnce {
			s, err := safeack.NewSubscriber(cfg, nil)
			if err != nil {
				r.err = err
				return r
			}
			sub = s
			break
		}
		pc := consumerConfig()
		pc.Producer.Partitioner = sarama.NewHashPartitioner
		s, tp, err := safeack.NewTxnSubscriber(cfg, safeack.TxnConfig{
			TransactionalID: group, CommitInterval: opt.txnInterval, OverwriteSaramaConfig: pc,
		}, nil)
		if err != nil {
			r.err = err
			return r
		}
		sub, txnPub, pub = s, tp, tp
		router.AddMiddleware(txnPub.Middleware)
	}
	if pub == nil {
		pc := wmkafka.DefaultSaramaSyncPublisherConfig()
		pc.Version = consumerConfig().Version
		p, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{Brokers: env.brokers, Marshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: pc}, nil)
		if err != nil {
			_ = sub.Close()
			r.err = err
			return r
		}
		pub = p
	}
	router.AddHandler("transform", t.name, sub, out, pub, handler)

	cpu0 := cpuTime()
	t0 := time.Now()
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-allAcked:
	case err := <-done:
		r.err = fmt.Errorf("router stopped: %v", err)
		return r
	case <-time.After(10 * time.Minute):
		r.err = fmt.Errorf("not every record acked within 10 minutes (%d)", acked.Load())
		_ = router.Close()
		return r
	}
	lastAck := time.Now()
	at, ok := env.waitCommitted(ctx, t, group, 60*time.Second)
	if ok {
		r.endLag = at.Sub(lastAck)
		r.extra["endlag_s"] = r.endLag.Seconds()
	}
	end := lastAck
	if kind == txnExactlyOnce {
		if !ok {
			r.err = fmt.Errorf("offsets not committed to the end within 60 s")
		}
		end = at // outputs are visible (read_committed) only once committed
	}
	r.wall = end.Sub(t0)
	r.active = r.wall
	r.cpu = cpuTime() - cpu0
	if txnPub != nil {
		st := txnPub.Stats()
		r.extra["txns"] = float64(st.Committed)
		if st.Committed > 0 {
			r.extra["commit_ms"] = float64(st.CommitTime.Microseconds()) / 1000 / float64(st.Committed)
			r.extra["commit_max_ms"] = float64(st.MaxCommit.Microseconds()) / 1000
		}
		r.extra["during_commit"] = float64(st.AckedDuringCommit) / float64(c.topic.n)
		if st.Aborted > 0 {
			r.extra["aborted"] = float64(st.Aborted)
		}
	}
	if err := router.Close(); err != nil && r.err == nil {
		r.err = err
	}
	<-done
	_ = pub.Close()
	return r
}

func init() {
	for col, title := range map[string]string{
		"x:vs_alo":        "×at-least-once",
		"x:txns":          "txns",
		"x:commit_ms":     "commit ms",
		"x:commit_max_ms": "max commit ms",
		"x:during_commit": "acked during commit",
		"x:endlag_s":      "end lag s",
	} {
		colTitles[col] = title
	}
}
