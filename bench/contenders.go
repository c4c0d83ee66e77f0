package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack"
)

// ackTracker counts acks by record index. Times are offsets from base on the
// monotonic clock.
type ackTracker struct {
	n     int
	base  time.Time
	seen  []atomic.Uint32
	ackAt []atomic.Uint32 // µs after base of a record's first ack, +1 (0 = not acked)
	uniq  atomic.Int64
	total atomic.Int64
	first atomic.Int64 // ns after base of the first delivery, +1 (0 = none)
	last  atomic.Int64 // ns after base when the last unique ack happened
	busy  atomic.Int64 // ns spent in handlers, summed over all of them
	done  chan struct{}
	// firstC is closed at the first delivery.
	firstC    chan struct{}
	firstOnce sync.Once
}

func newAckTracker(n int) *ackTracker {
	return &ackTracker{n: n, seen: make([]atomic.Uint32, n), ackAt: make([]atomic.Uint32, n), done: make(chan struct{}), firstC: make(chan struct{})}
}

func (t *ackTracker) start() { t.base = time.Now() }

func (t *ackTracker) delivered() {
	if t.first.Load() == 0 {
		t.setFirst(time.Since(t.base))
	}
}

// setFirst records the first delivery, d after base.
func (t *ackTracker) setFirst(d time.Duration) {
	if t.first.CompareAndSwap(0, int64(d)+1) {
		t.firstOnce.Do(func() { close(t.firstC) })
	}
}

func (t *ackTracker) acked(i int) { t.ackedAfter(i, time.Since(t.base)) }

// ackedAfter records an ack of record i that happened el after base (a
// child process reports its acks with their times).
func (t *ackTracker) ackedAfter(i int, el time.Duration) {
	if i < 0 {
		return // a warm-up record of the steady workload
	}
	t.total.Add(1)
	if i >= t.n {
		return
	}
	if t.seen[i].Add(1) == 1 {
		t.ackAt[i].Store(uint32(el/time.Microsecond) + 1)
		if t.uniq.Add(1) == int64(t.n) {
			t.last.Store(int64(el))
			close(t.done)
		}
	}
}

// ackUnixNano is when record i was first acked (unix ns), 0 if never.
func (t *ackTracker) ackUnixNano(i int) int64 {
	us := t.ackAt[i].Load()
	if us == 0 {
		return 0
	}
	return t.base.UnixNano() + int64(us-1)*int64(time.Microsecond)
}

// worked adds one handler's time, from receiving its message to acking it.
func (t *ackTracker) worked(d time.Duration) { t.busy.Add(int64(d)) }

func recordIndex(payload []byte) int {
	if len(payload) < 8 {
		return -1
	}
	return int(binary.BigEndian.Uint64(payload))
}

// contender is a running consumer.
type contender struct {
	stop     func() error
	retained func() int // nil unless safeack
	// failed is closed when the consumer gave up before acking everything
	// (a child process that exited); failErr says why. nil for in-process
	// consumers.
	failed  chan struct{}
	failErr error
	// ext holds the figures a consumer in another process measured itself.
	ext *extStats
	// extra, when set, gives workload-specific figures (result.extra)
	// after the contender stopped.
	extra func() map[string]float64
}

func (c *contender) err() error { return c.failErr }

// extStats are a child-process consumer's own CPU, memory and handler
// figures, replacing the bench process's.
type extStats struct {
	cpu  time.Duration
	heap uint64
	rss  uint64
	busy time.Duration
	dups int64
}

// startContender starts c consuming t in group; every record it completes
// is reported to tr.
func startContender(ctx context.Context, env *brokerEnv, c *caseSpec, t *topic, group string, tr *ackTracker) (*contender, error) {
	switch c.kind {
	case kindShare:
		return startShare(ctx, env, c, t, group, tr)
	case kindSafeack:
		if c.poisonEvery > 0 || c.share {
			return startGroupRouter(ctx, env, c, t, group, tr)
		}
		cfg, err := safeackConfig(env, c, group)
		if err != nil {
			return nil, err
		}
		s, err := safeack.NewSubscriber(cfg, wmLogger(c.label))
		if err != nil {
			return nil, err
		}
		var stop func() error
		if c.router {
			stop, err = runRouter(ctx, s, t.name, c.work, tr)
		} else {
			var ch <-chan *message.Message
			if ch, err = s.Subscribe(ctx, t.name); err == nil {
				done := consumeChannel(ch, c.work, tr)
				stop = func() error { err := s.Close(); <-done; return err }
			}
		}
		if err != nil {
			_ = s.Close()
			return nil, err
		}
		return &contender{
			stop: stop,
			retained: func() int {
				n := 0
				for _, ps := range s.Stats() {
					n += ps.Retained
				}
				return n
			},
		}, nil
	case kindWatermill:
		s, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
			Brokers:               env.brokers,
			Unmarshaler:           wmkafka.DefaultMarshaler{},
			OverwriteSaramaConfig: consumerConfig(),
			ConsumerGroup:         group,
			Tracer:                benchTracer(),
		}, wmLogger(c.label))
		if err != nil {
			return nil, err
		}
		if c.router {
			stop, err := runRouter(ctx, s, t.name, c.work, tr)
			if err != nil {
				_ = s.Close()
				return nil, err
			}
			return &contender{stop: stop}, nil
		}
		ch, err := s.Subscribe(ctx, t.name)
		if err != nil {
			_ = s.Close()
			return nil, err
		}
		done := consumeChannel(ch, c.work, tr)
		return &contender{stop: func() error { err := s.Close(); <-done; return err }}, nil
	case kindLocal:
		return startLocal(ctx, c, tr), nil
	case kindPC:
		return startPC(c, env, t, group, tr)
	case kindCeiling:
		if c.label == routerCeilingLabel {
			return startRouterCeiling(ctx, c, tr)
		}
		return startCeiling(ctx, c, tr)
	case kindBare:
		return startBare(ctx, env, t, group, func(m *sarama.ConsumerMessage) {
			tr.delivered()
			tr.acked(recordIndex(m.Value))
		})
	}
	return nil, fmt.Errorf("unknown contender kind %d", c.kind)
}

func safeackConfig(env *brokerEnv, c *caseSpec, group string) (safeack.SubscriberConfig, error) {
	cfg := safeack.SubscriberConfig{
		Brokers:               env.brokers,
		OverwriteSaramaConfig: consumerConfig(),
		ConsumerGroup:         group,
		MaxInFlight:           c.conc,
		Ordering:              c.ordering,
		GroupProtocol:         c.protocol,
		// No tap Tracer: a Tracer turns safeack's early first fetch off
		// (it must see every record on the claim); the wiretap still logs
		// safeack's requests, without the handler's marks.
	}
	if err := applySettings(&cfg, opt.safeackSet); err != nil {
		return cfg, err
	}
	if err := applySettings(&cfg, c.settings); err != nil {
		return cfg, err
	}
	if c.churn != nil {
		cfg.GroupProtocol = c.churn.protocol
	}
	return cfg, nil
}

// wmLogger is Watermill's standard logger at Info level with -v, else nil
// (no logging).
func wmLogger(label string) watermill.LoggerAdapter {
	if !opt.verbose {
		return nil
	}
	return watermill.NewStdLogger(false, false).With(watermill.LogFields{"contender": label})
}

// consumeChannel is the handler side, as Watermill's router runs it: a
// goroutine per message that works, then acks.
func consumeChannel(ch <-chan *message.Message, work []time.Duration, tr *ackTracker) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for msg := range ch {
			tr.delivered()
			go func(m *message.Message) {
				began := time.Now()
				i := recordIndex(m.Payload)
				if work != nil && i >= 0 && i < len(work) {
					if d := work[i]; d > 0 {
						time.Sleep(d)
					}
				}
				m.Ack()
				tr.worked(time.Since(began))
				tr.acked(i)
			}(msg)
		}
	}()
	return done
}

// startLocal runs the same handler on records 0..n-1 from memory, with at
// most c.conc at once: what this machine's scheduler and timers allow
// without any Kafka client in the way.
func startLocal(ctx context.Context, c *caseSpec, tr *ackTracker) *contender {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sem := make(chan struct{}, c.conc)
		var wg sync.WaitGroup
		for i := range c.topic.n {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return
			}
			tr.delivered()
			wg.Add(1)
			go func() {
				defer wg.Done()
				began := time.Now()
				if d := c.work[i]; d > 0 {
					time.Sleep(d)
				}
				<-sem
				tr.worked(time.Since(began))
				tr.acked(i)
			}()
		}
		wg.Wait()
	}()
	return &contender{stop: func() error { cancel(); <-done; return nil }}
}

// bareHandler marks every record as it arrives: no concurrency, no work.
type bareHandler struct {
	onRecord func(*sarama.ConsumerMessage)
}

func (bareHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (bareHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h bareHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		h.onRecord(m)
		sess.MarkMessage(m, "")
	}
	return nil
}

func startBare(ctx context.Context, env *brokerEnv, t *topic, group string, onRecord func(*sarama.ConsumerMessage)) (*contender, error) {
	g, err := sarama.NewConsumerGroup(env.brokers, group, consumerConfig())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for err := range g.Errors() {
			vlogf("sarama-bare: %v", err)
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{t.name}, bareHandler{onRecord: onRecord}); err != nil {
				if !errors.Is(err, sarama.ErrClosedConsumerGroup) && ctx.Err() == nil {
					vlogf("sarama-bare consume: %v", err)
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
	}()
	return &contender{stop: func() error {
		cancel()
		err := g.Close()
		wg.Wait()
		return err
	}}, nil
}

// applySettings sets fields of cfg (a pointer to a safeack config struct)
// by name, so the bench compiles whatever fields the package has today and
// can switch on new ones from the command line.
func applySettings(cfg any, set map[string]string) error {
	v := reflect.ValueOf(cfg).Elem()
	for name, s := range set {
		f := v.FieldByName(name)
		if !f.IsValid() || !f.CanSet() {
			return fmt.Errorf("%s has no field %s", v.Type(), name)
		}
		if err := setField(f, s); err != nil {
			return fmt.Errorf("%s=%s: %w", name, s, err)
		}
	}
	return nil
}

func hasField(name string) bool {
	_, ok := reflect.TypeOf(safeack.SubscriberConfig{}).FieldByName(name)
	return ok
}

func setField(f reflect.Value, s string) error {
	if f.Type() == reflect.TypeOf(time.Duration(0)) {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		f.SetInt(int64(d))
		return nil
	}
	if f.Type() == reflect.TypeOf(safeack.Ordering(0)) {
		for _, o := range []safeack.Ordering{safeack.OrderByKey, safeack.OrderByPartition, safeack.Unordered} {
			if o.String() == s {
				f.SetInt(int64(o))
				return nil
			}
		}
	}
	switch f.Kind() {
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		f.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 0, 64)
		if err != nil {
			return err
		}
		f.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			return err
		}
		f.SetUint(n)
	case reflect.Float32, reflect.Float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		f.SetFloat(x)
	case reflect.String:
		f.SetString(s)
	default:
		return fmt.Errorf("cannot set a %s from the command line", f.Type())
	}
	return nil
}
