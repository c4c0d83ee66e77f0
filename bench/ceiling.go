package main

import (
	"context"
	"encoding/binary"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// ceilingLabel is the Watermill ceiling: a message.Router over an in-memory
// gochannel.GoChannel, no Kafka. Whatever a Watermill subscriber does, its
// messages still pass through a router like this one; at zero work this is
// the rate no Watermill subscriber can beat on this machine.
const ceilingLabel = "watermill ceiling (router+gochannel)"

// routerHandler is the bench handler as a router handler: the same work
// and bookkeeping as consumeChannel's goroutine; the router acks when it
// returns.
func routerHandler(work []time.Duration, tr *ackTracker, after func()) message.NoPublishHandlerFunc {
	return func(m *message.Message) error {
		tr.delivered()
		began := time.Now()
		i := recordIndex(m.Payload)
		if work != nil && i >= 0 && i < len(work) {
			if d := work[i]; d > 0 {
				time.Sleep(d)
			}
		}
		if after != nil {
			after()
		}
		tr.worked(time.Since(began))
		tr.acked(i)
		return nil
	}
}

// startCeiling publishes records 0..n-1 (100-byte values, index first, no
// UUID, like the Kafka records) into a GoChannel from one goroutine, at most
// c.conc unacknowledged at once (GoChannel itself does not bound what is in
// flight; the handler frees a slot just before it returns), and consumes
// them with a Router.
func startCeiling(ctx context.Context, c *caseSpec, tr *ackTracker) (*contender, error) {
	ctx, cancel := context.WithCancel(ctx)
	const topic = "ceiling"
	pubsub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(c.conc)}, nil)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	sem := make(chan struct{}, c.conc)
	router.AddConsumerHandler("bench", topic, pubsub, routerHandler(c.work, tr, func() { <-sem }))
	routerDone := make(chan struct{})
	go func() { defer close(routerDone); _ = router.Run(ctx) }()
	<-router.Running()
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		// Publish in batches of whatever the semaphore admits (up to 64),
		// as a fetch loop hands over a batch: GoChannel takes its locks once
		// per Publish call.
		batch := make([]*message.Message, 0, 64)
		for i := 0; i < c.topic.n; {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			batch = batch[:0]
			for {
				v := make([]byte, max(c.topic.valueSize, 8))
				binary.BigEndian.PutUint64(v, uint64(i))
				batch = append(batch, message.NewMessage("", v))
				i++
				if i == c.topic.n || len(batch) == cap(batch) {
					break
				}
				select {
				case sem <- struct{}{}:
					continue
				default:
				}
				break
			}
			if err := pubsub.Publish(topic, batch...); err != nil {
				return
			}
		}
	}()
	return &contender{stop: func() error {
		cancel()
		<-pubDone
		err := router.Close()
		<-routerDone
		_ = pubsub.Close()
		return err
	}}, nil
}

// runRouter consumes topic from sub with a message.Router and the bench
// handler, as an application would.
func runRouter(ctx context.Context, sub message.Subscriber, topic string, work []time.Duration, tr *ackTracker) (func() error, error) {
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("bench", topic, sub, routerHandler(work, tr, nil))
	done := make(chan struct{})
	go func() { defer close(done); _ = router.Run(ctx) }()
	select {
	case <-router.Running():
	case <-done:
		return nil, router.Close()
	}
	return func() error {
		err := router.Close() // closes sub too
		<-done
		_ = sub.Close()
		return err
	}, nil
}

// routerCeilingLabel is a tighter ceiling: the same Router over the least a
// Subscriber can be (a goroutine that builds the records and sends them on
// the subscription channel), so it measures the router alone. GoChannel
// spends two goroutines, two message copies and a context per message of
// its own, which a Kafka subscriber need not.
const routerCeilingLabel = "watermill router ceiling (bare channel)"

// memSubscriber emits records 0..n-1 on one channel, at most conc
// unacknowledged (the handler frees a slot just before it returns).
type memSubscriber struct {
	n, valueSize int
	sem          chan struct{}
	stop         chan struct{}
	once         sync.Once
}

func (s *memSubscriber) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for i := range s.n {
			select {
			case s.sem <- struct{}{}:
			case <-ctx.Done():
				return
			case <-s.stop:
				return
			}
			v := make([]byte, max(s.valueSize, 8))
			binary.BigEndian.PutUint64(v, uint64(i))
			msg := message.NewMessage("", v)
			select {
			case out <- msg:
			case <-ctx.Done():
				return
			case <-s.stop:
				return
			}
		}
		select {
		case <-ctx.Done():
		case <-s.stop:
		}
	}()
	return out, nil
}

func (s *memSubscriber) Close() error {
	s.once.Do(func() { close(s.stop) })
	return nil
}

func startRouterCeiling(ctx context.Context, c *caseSpec, tr *ackTracker) (*contender, error) {
	sub := &memSubscriber{n: c.topic.n, valueSize: c.topic.valueSize, sem: make(chan struct{}, c.conc), stop: make(chan struct{})}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 5 * time.Second}, nil)
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("bench", "mem", sub, routerHandler(c.work, tr, func() { <-sub.sem }))
	done := make(chan struct{})
	go func() { defer close(done); _ = router.Run(ctx) }()
	<-router.Running()
	return &contender{stop: func() error {
		err := router.Close()
		<-done
		return err
	}}, nil
}
