package safeack_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// defaultTxn is a transactional router as a new user writes it: a
// subscriber with only Brokers and ConsumerGroup, a TxnPublisher with only
// a TransactionalID, inputs from watermill-kafka's key-less
// DefaultMarshaler.
type defaultTxn struct {
	c      *kafkatest.Cluster
	in     string
	group  string
	sub    *safeack.Subscriber
	pub    *safeack.TxnPublisher
	router *message.Router
	inPub  message.Publisher
}

func newDefaultTxn(t *testing.T, c *kafkatest.Cluster, partitions int, txnID string, mods ...func(*safeack.SubscriberConfig)) *defaultTxn {
	t.Helper()
	skipOnConsumerProtocol(t, "transactions")
	d := &defaultTxn{c: c, in: c.NewTopic(t, partitions), group: c.NewGroup(t)}
	logger := testLogger()
	cfg := safeack.SubscriberConfig{Brokers: c.Brokers(), ConsumerGroup: d.group,
		OverwriteSaramaConfig: defaultsOn(c, safeack.DefaultSaramaSubscriberConfig)}
	for _, mod := range mods {
		mod(&cfg)
	}
	var err error
	d.sub, d.pub, err = safeack.NewTxnSubscriber(cfg, safeack.TxnConfig{TransactionalID: txnID}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.sub.Close() })
	d.router, err = message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	d.inPub, err = kafka.NewPublisher(kafka.PublisherConfig{Brokers: c.Brokers(), Marshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: defaultsOn(c, kafka.DefaultSaramaSyncPublisherConfig)}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.inPub.Close() })
	return d
}

// run starts the router and waits until the subscriber owns its partitions.
func (d *defaultTxn) run(t *testing.T) (stop func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- d.router.Run(context.Background()) }()
	select {
	case <-d.router.Running():
	case err := <-done:
		t.Fatalf("router stopped at start: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, d.sub.WaitReady(ctx))
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		require.NoError(t, d.router.Close())
		require.NoError(t, <-done)
	}
	t.Cleanup(stop)
	return stop
}

// publish writes n inputs with payload; it returns their UUIDs.
func (d *defaultTxn) publish(t *testing.T, payload string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		m := message.NewMessage(watermill.NewUUID(), []byte(payload))
		ids[i] = m.UUID
		require.NoError(t, d.inPub.Publish(d.in, m))
	}
	return ids
}

// outputFor is the output of msg, carrying the input's UUID.
func outputFor(msg *message.Message, payload string) *message.Message {
	out := message.NewMessage(watermill.NewUUID(), []byte(payload))
	out.Metadata.Set(hdrInputID, msg.UUID)
	return out
}

// An output the transaction could never write — above the producer's
// MaxMessageBytes, or to a topic the cluster does not have — is refused by
// Publish, or by Middleware when the handler returns it, so that the
// handler's error reaches Watermill's PoisonQueue, the input is
// dead-lettered, and the other inputs' outputs are committed. Before,
// Publish buffered it and every transaction it entered aborted: the record
// was handled again, wrote it again, and the subscription never committed
// anything again; returned, it failed the router's Publish after the
// middleware, which nacked the input forever.
func TestTxnUnwritableOutputRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		bad      func(out string) (topic string, payload []byte)
		cause    error
		returned bool // the handler returns the output instead of publishing it
	}{
		{name: "above MaxMessageBytes", bad: func(out string) (string, []byte) {
			return out, make([]byte, sarama.NewConfig().Producer.MaxMessageBytes+1)
		}, cause: sarama.ErrMessageSizeTooLarge},
		// Within Sarama's own check (record overhead at most 36 bytes), but
		// not in a record batch (61 bytes of header) the broker's default
		// message.max.bytes (1 MiB + 12) accepts.
		{name: "within Sarama's check, not in the broker's batch", bad: func(out string) (string, []byte) {
			return out, make([]byte, sarama.NewConfig().Producer.MaxMessageBytes-116)
		}, cause: sarama.ErrMessageSizeTooLarge},
		{name: "unknown topic", bad: func(string) (string, []byte) {
			return "no-such-topic", []byte("x")
		}, cause: sarama.ErrUnknownTopicOrPartition},
		{name: "returned above MaxMessageBytes", bad: func(out string) (string, []byte) {
			return out, make([]byte, sarama.NewConfig().Producer.MaxMessageBytes+1)
		}, cause: sarama.ErrMessageSizeTooLarge, returned: true},
		{name: "returned within Sarama's check, not in the broker's batch", bad: func(out string) (string, []byte) {
			return out, make([]byte, sarama.NewConfig().Producer.MaxMessageBytes-116)
		}, cause: sarama.ErrMessageSizeTooLarge, returned: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.Start(t)
			if errors.Is(tc.cause, sarama.ErrUnknownTopicOrPartition) && c.AutoCreatesTopics(t) {
				t.Skip("the cluster creates a topic its metadata is asked for (auto.create.topics.enable): every topic exists")
			}
			d := newDefaultTxn(t, c, 1, "txn-unwritable")
			out := c.NewTopic(t, 1)
			dlq, poison := d.deadLetters(t)
			refused := make(chan error, 1)
			d.router.AddMiddleware(poison, errorsTo(refused), d.pub.Middleware)
			d.router.AddHandler("h", d.in, d.sub, out, d.pub, func(msg *message.Message) ([]*message.Message, error) {
				if string(msg.Payload) != "bad" {
					return []*message.Message{outputFor(msg, "ok")}, nil
				}
				topic, payload := tc.bad(out)
				o := message.NewMessage(watermill.NewUUID(), payload)
				if tc.returned {
					return []*message.Message{o}, nil
				}
				o.SetContext(msg.Context())
				return nil, d.pub.Publish(topic, o)
			})
			d.run(t)
			rd := readOutputs(t, c, out, 1, sarama.ReadCommitted)
			dl := readOutputs(t, c, dlq, 1, sarama.ReadCommitted)
			before := d.publish(t, "ok", 3)
			d.publish(t, "bad", 1)
			after := d.publish(t, "ok", 3)

			ids := append(before, after...)
			d.requireOneDeadLetter(t, rd, dl, out, ids, "the bad input dead-lettered", refused, tc.cause)
		})
	}
}

// Outputs a handler published itself and then failed — by an error or a
// panic — never become visible, also when Watermill's Retry tries the
// message again or its PoisonQueue dead-letters it and acks: Middleware,
// inside them, drops a failed attempt's outputs. Before, they were
// committed with the successful attempt's outputs or with the dead letter.
func TestTxnFailedAttemptOutputsDropped(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 1, "txn-failed-attempt")
	out := c.NewTopic(t, 1)
	dlq, poison := d.deadLetters(t)
	retry := middleware.Retry{MaxRetries: 1, InitialInterval: time.Millisecond}
	d.router.AddMiddleware(poison, retry.Middleware, middleware.Recoverer, d.pub.Middleware)
	var att attempts
	d.router.AddHandler("h", d.in, d.sub, out, d.pub, func(msg *message.Message) ([]*message.Message, error) {
		n := att.next(msg)
		o := outputFor(msg, "self")
		o.Metadata.Set(hdrAttempt, strconv.Itoa(n))
		o.SetContext(msg.Context())
		if err := d.pub.Publish(out, o); err != nil {
			return nil, err
		}
		switch string(msg.Payload) {
		case "panics":
			panic("after publishing")
		case "fails once":
			if n == 1 {
				return nil, errors.New("after publishing")
			}
		}
		return nil, nil
	})
	rd, dl := d.runReading(t, out, dlq)
	ok := d.publish(t, "ok", 3)
	flaky := d.publish(t, "fails once", 3)
	poisoned := d.publish(t, "panics", 2)
	ids := append(ok, flaky...)

	rd.waitAll(t, ids, 20*time.Second)
	dl.waitRecords(t, len(poisoned), "the panicking inputs dead-lettered")
	rd.complete(t, c, out, 1)
	rd.checkExactlyOnce(t, ids) // and nothing of the poisoned ones
	rd.requireAttempt(t, flaky, "2")
}

// The shapes of handler a new user writes, on defaults (OffsetNewest with
// history before the group, key-less inputs, OrderByKey): several outputs,
// none, outputs to two topics (returned and self-published), and an
// output published without the input's context (ErrNoDelivery, nothing
// written). A read_committed reader sees each expected output exactly
// once, none of the history's, and the group commits to the end.
func TestTxnDefaultsHandlerShapes(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 2, "txn-shapes")
	out, other := c.NewTopic(t, 2), c.NewTopic(t, 1)
	history := d.publish(t, "ok", 5)
	d.router.AddMiddleware(d.pub.Middleware)
	output := func(msg *message.Message, k int) *message.Message {
		o := outputFor(msg, "out")
		o.Metadata.Set(hdrInputID, msg.UUID+"#"+strconv.Itoa(k))
		return o
	}
	noDelivery := make(chan error, 10)
	d.router.AddHandler("h", d.in, d.sub, out, d.pub, func(msg *message.Message) ([]*message.Message, error) {
		switch string(msg.Payload) {
		case "several":
			return []*message.Message{output(msg, 0), output(msg, 1), output(msg, 2)}, nil
		case "none":
			return nil, nil
		case "two topics":
			o := output(msg, 1)
			o.SetContext(msg.Context())
			if err := d.pub.Publish(other, o); err != nil {
				return nil, err
			}
		case "no context":
			noDelivery <- d.pub.Publish(out, output(msg, 1))
		}
		return []*message.Message{output(msg, 0)}, nil
	})
	d.run(t)
	rd := readOutputs(t, c, out, 2, sarama.ReadCommitted)
	rdOther := readOutputs(t, c, other, 1, sarama.ReadCommitted)
	var want, wantOther []string
	for _, payload := range []string{"ok", "several", "none", "two topics", "no context"} {
		for _, id := range d.publish(t, payload, 4) {
			switch payload {
			case "several":
				want = append(want, id+"#0", id+"#1", id+"#2")
			case "none":
			case "two topics":
				want = append(want, id+"#0")
				wantOther = append(wantOther, id+"#1")
			default:
				want = append(want, id+"#0")
			}
		}
	}
	rd.waitAll(t, want, 20*time.Second)
	rdOther.waitAll(t, wantOther, 20*time.Second)
	hwm := c.HighWaterMarks(t, d.in)
	kafkatest.WaitFor(t, 20*time.Second, "the group's commits to reach the end", func() bool {
		got := c.CommittedOffsets(t, d.group, d.in)
		for p, h := range hwm {
			if got[p].Offset != h {
				return false
			}
		}
		return true
	})
	rd.complete(t, c, out, 2)
	rdOther.complete(t, c, other, 1)
	rd.checkExactlyOnce(t, want) // nothing of the history, nor of "none"
	rdOther.checkExactlyOnce(t, wantOther)
	for range 4 {
		require.ErrorIs(t, <-noDelivery, safeack.ErrNoDelivery)
	}
	for _, id := range history {
		require.Zero(t, rd.seen([]string{id + "#0"}), "history before the group was handled")
	}
	require.Zero(t, d.pub.Stats().Aborted)
}

// Watermill's plain PoisonQueue dead-letters a record whose handler gave
// up because Close cancelled its context; with the TxnPublisher as its
// publisher, that dead letter is never written: the drain gave up on the
// record before its ack, so nothing of it enters a transaction, and the
// group's offset stays on it for the next owner.
func TestTxnPlainPoisonQueueAtClose(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 1, "txn-poison-close", func(cfg *safeack.SubscriberConfig) {
		cfg.DrainTimeout = 300 * time.Millisecond
	})
	out := c.NewTopic(t, 1)
	dlq, poison := d.deadLetters(t)
	d.router.AddMiddleware(poison, d.pub.Middleware)
	held := make(chan struct{}, 1)
	d.router.AddHandler("h", d.in, d.sub, out, d.pub, func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "hold" {
			held <- struct{}{}
			<-msg.Context().Done()
			return nil, msg.Context().Err()
		}
		return []*message.Message{outputFor(msg, "ok")}, nil
	})
	stop := d.run(t)
	rd := readOutputs(t, c, out, 1, sarama.ReadCommitted)
	dl := readOutputs(t, c, dlq, 1, sarama.ReadUncommitted)
	ok := d.publish(t, "ok", 3)
	d.publish(t, "hold", 1)
	rd.waitAll(t, ok, 20*time.Second)
	<-held
	stop()

	dl.complete(t, c, dlq, 1)
	dl.mu.Lock()
	require.Empty(t, dl.byID, "a record cut short by Close was dead-lettered")
	dl.mu.Unlock()
	require.Equal(t, int64(len(ok)), c.CommittedOffsets(t, d.group, d.in)[0].Offset, "the group's offset passed the held record")
}

// Middleware, added to the whole router, checks returned outputs only for
// handlers whose router publisher is a TxnPublisher: another handler's
// output, published elsewhere, is not held to this producer's size limit or
// this cluster's topics.
func TestTxnMiddlewareLeavesOtherPublishersOutputs(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 1, "txn-other-publisher")
	elsewhere := gochannel.NewGoChannel(gochannel.Config{}, testLogger())
	t.Cleanup(func() { _ = elsewhere.Close() })
	received, err := elsewhere.Subscribe(context.Background(), "no-such-kafka-topic")
	require.NoError(t, err)
	d.router.AddMiddleware(d.pub.Middleware)
	big := make([]byte, sarama.NewConfig().Producer.MaxMessageBytes+1)
	d.router.AddHandler("elsewhere", d.in, d.sub, "no-such-kafka-topic", elsewhere, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), big)}, nil
	})
	d.run(t)
	d.publish(t, "in", 1)
	select {
	case m := <-received:
		require.Len(t, m.Payload, len(big))
		m.Ack()
	case <-time.After(20 * time.Second):
		t.Fatal("the output for another publisher was not published")
	}
	kafkatest.WaitFor(t, 20*time.Second, "the input committed", func() bool {
		return c.CommittedOffsets(t, d.group, d.in)[0].Offset == 1
	})
}

// A middleware that gives the input message a context not derived from
// the one it was delivered with, after the handler published its outputs,
// does not lose them: the worker tells the transaction which delivery was
// acked, rather than the transaction reading it from the message's
// context. Before, the ack found no delivery in the replaced context, the
// record completed and its offset was committed without its outputs.
func TestTxnOutputsSurviveReplacedContext(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 1, "txn-replaced-context")
	out := c.NewTopic(t, 1)
	type traceKey struct{}
	replaceContext := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			outs, err := h(msg)
			// As a middleware rebuilding a context from the message's
			// metadata (a trace) might.
			msg.SetContext(context.WithValue(context.Background(), traceKey{}, msg.UUID))
			return outs, err
		}
	}
	d.router.AddMiddleware(replaceContext, d.pub.Middleware)
	d.router.AddHandler("h", d.in, d.sub, out, d.pub, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{outputFor(msg, "out")}, nil
	})
	d.run(t)
	rd := readOutputs(t, c, out, 1, sarama.ReadCommitted)
	ids := d.publish(t, "in", 20)
	rd.waitAll(t, ids, 20*time.Second)
	rd.complete(t, c, out, 1)
	rd.checkExactlyOnce(t, ids)
}

// Messages a handler returns together with an error are a failed attempt's
// outputs too. Watermill's PoisonQueue and Retry pass a failed handler's
// returned messages on: PoisonQueue turns the error into nil, and the
// router then publishes them. Middleware, inside them, drops them with the
// error. Before, it returned them as they came, without the delivery in
// their context: the router's Publish failed with ErrNoDelivery and nacked
// the record, which was dead-lettered again (and the dead letter dropped
// with the Nack) forever, stalling its partition.
func TestTxnFailedAttemptReturnedOutputsDropped(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 1, "txn-failed-returned")
	out := c.NewTopic(t, 1)
	dlq, poison := d.deadLetters(t)
	d.router.AddMiddleware(poison, d.pub.Middleware)
	d.router.AddHandler("h", d.in, d.sub, out, d.pub, func(msg *message.Message) ([]*message.Message, error) {
		outs := []*message.Message{outputFor(msg, "returned")}
		if string(msg.Payload) == "fails" {
			return outs, errors.New("after building its outputs")
		}
		return outs, nil
	})
	rd, dl := d.runReading(t, out, dlq)
	ok := d.publish(t, "ok", 3)
	poisoned := d.publish(t, "fails", 2)

	rd.waitAll(t, ok, 20*time.Second)
	dl.waitRecords(t, len(poisoned), "the failing inputs dead-lettered")
	rd.complete(t, c, out, 1)
	rd.checkExactlyOnce(t, ok) // and nothing of the failed ones
}

// A handler that defers its record's completion (safeack.Defer) and
// returns its outputs: they enter a transaction once the Completion is
// Done, and never when it Fails (the record is handled again, and only the
// attempt that completed has its output committed).
func TestTxnDeferredCompletion(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 2, "txn-deferred")
	out := c.NewTopic(t, 2)
	d.router.AddMiddleware(d.pub.Middleware)
	var att attempts
	d.router.AddHandler("h", d.in, d.sub, out, d.pub, func(msg *message.Message) ([]*message.Message, error) {
		n := att.next(msg)
		o := outputFor(msg, "deferred")
		o.Metadata.Set(hdrAttempt, strconv.Itoa(n))
		comp, err := safeack.Defer(msg)
		if err != nil {
			return nil, err
		}
		fail := string(msg.Payload) == "fails once" && n == 1
		time.AfterFunc(20*time.Millisecond, func() { // a batching writer's flush
			if fail {
				comp.Fail(errors.New("the write failed"))
				return
			}
			comp.Done()
		})
		return []*message.Message{o}, nil
	})
	d.run(t)
	rd := readOutputs(t, c, out, 2, sarama.ReadCommitted)
	ok := d.publish(t, "ok", 6)
	flaky := d.publish(t, "fails once", 4)
	ids := append(ok, flaky...)

	rd.waitAll(t, ids, 20*time.Second)
	rd.complete(t, c, out, 2)
	rd.checkExactlyOnce(t, ids)
	rd.requireAttempt(t, flaky, "2")
}

// Two subscriptions of one Subscriber (two input topics, one consumer
// group) share one TxnPublisher: each commits its own topic's offsets with
// its own producer, and the two members' rebalances (each Subscribe joins
// the group) lose and duplicate nothing.
func TestTxnTwoSubscriptionsSharePublisher(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	d := newDefaultTxn(t, c, 2, "txn-two-subs")
	in2, out := c.NewTopic(t, 2), c.NewTopic(t, 2)
	d.router.AddMiddleware(d.pub.Middleware)
	h := func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{outputFor(msg, "out")}, nil
	}
	d.router.AddHandler("h1", d.in, d.sub, out, d.pub, h)
	d.router.AddHandler("h2", in2, d.sub, out, d.pub, h)
	d.run(t)
	rd := readOutputs(t, c, out, 2, sarama.ReadCommitted)
	var ids []string
	for range 5 {
		ids = append(ids, d.publish(t, "ok", 4)...)
		for range 4 {
			m := message.NewMessage(watermill.NewUUID(), []byte("ok"))
			ids = append(ids, m.UUID)
			require.NoError(t, d.inPub.Publish(in2, m))
		}
	}
	rd.waitAll(t, ids, 20*time.Second)
	rd.complete(t, c, out, 2)
	rd.checkExactlyOnce(t, ids)
	require.Zero(t, d.pub.Stats().Aborted)
}

// requireAttempt requires the first output of each id to come from the
// handler's attempt (the hdrAttempt header): the output of a retried
// input is its later attempt's.
func (rd *outputReader) requireAttempt(t *testing.T, ids []string, attempt string) {
	t.Helper()
	rd.mu.Lock()
	defer rd.mu.Unlock()
	for _, id := range ids {
		require.Equal(t, attempt, headerOf(rd.byID[id][0], hdrAttempt), "output of %s from its failed attempt", id)
	}
}

// runReading runs d's router, then reads out and the dead-letter topic dlq
// (one partition each) with read_committed readers.
func (d *defaultTxn) runReading(t *testing.T, out, dlq string) (rd, dl *outputReader) {
	t.Helper()
	d.run(t)
	return readOutputs(t, d.c, out, 1, sarama.ReadCommitted), readOutputs(t, d.c, dlq, 1, sarama.ReadCommitted)
}

// deadLetters makes a dead-letter topic (one partition) and a PoisonQueue
// middleware that publishes to it through d's publisher.
func (d *defaultTxn) deadLetters(t *testing.T) (dlq string, poison message.HandlerMiddleware) {
	t.Helper()
	dlq = d.c.NewTopic(t, 1)
	poison, err := middleware.PoisonQueue(d.pub, dlq)
	require.NoError(t, err)
	return dlq, poison
}

// requireOneDeadLetter requires one visible output of each of ids in out
// (one partition), one dead letter in dl (what), the first handler error
// to be cause and no aborted transaction.
func (d *defaultTxn) requireOneDeadLetter(t *testing.T, rd, dl *outputReader, out string, ids []string, what string, refused <-chan error, cause error) {
	t.Helper()
	rd.waitAll(t, ids, 20*time.Second)
	dl.waitRecords(t, 1, what)
	rd.complete(t, d.c, out, 1)
	rd.checkExactlyOnce(t, ids)
	require.ErrorIs(t, <-refused, cause)
	require.Zero(t, d.pub.Stats().Aborted)
}
