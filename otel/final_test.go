package safeackotel_test

import (
	"cmp"
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/frontier"
	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/internal/safeacktest"
	safeackotel "github.com/safeack/safeack/otel"
)

// commitLog is an Observer that keeps the commit events it passes on.
type commitLog struct {
	safeack.Observer
	mu     sync.Mutex
	events []safeack.CommitEvent
}

func (l *commitLog) Committed(ev safeack.CommitEvent) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
	l.Observer.Committed(ev)
}

// finals returns the final commit events so far.
func (l *commitLog) finals() []safeack.CommitEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []safeack.CommitEvent
	for _, ev := range l.events {
		if ev.Final {
			out = append(out, ev)
		}
	}
	return out
}

// finalOf returns the first final position reported for partition, and
// whether it was held (Err nil).
func (l *commitLog) finalOf(partition int32) (p safeack.CommittedPartition, held, ok bool) {
	for _, ev := range l.finals() {
		for _, cp := range ev.Partitions {
			if cp.Partition == partition {
				return cp, ev.Err == nil, true
			}
		}
	}
	return safeack.CommittedPartition{}, false, false
}

// lastEvents returns the name of the last event of each ended delivery
// span of topic, by partition and offset.
func lastEvents(rec *tracetest.SpanRecorder, topic string) map[po]string {
	out := map[po]string{}
	for _, s := range rec.Ended() {
		if s.Name() != "process "+topic {
			continue
		}
		out[spanPO(s)] = lastEvent(s)
	}
	return out
}

func spanPO(s sdktrace.ReadOnlySpan) po {
	a := attrs(s.Attributes())
	p, _ := strconv.Atoi(a["messaging.destination.partition.id"].AsString())
	return po{int32(p), a["messaging.kafka.offset"].AsInt64()}
}

func lastEvent(s sdktrace.ReadOnlySpan) string {
	ev := s.Events()
	if len(ev) == 0 {
		return ""
	}
	return ev[len(ev)-1].Name
}

// TestFinalCommitsEndHeldSpans: with WithCommitEvents, each acked
// delivery's span is held until a commit covers its record. Acks out of
// order leave the head of each partition unanswered and a completed tail
// behind it, and the commit loop (one an hour) commits nothing meanwhile:
// only the final commit of the ending assignment (at Close, and at an
// eager rebalance's revocation) covers the acked records, in its tail. The
// subscriber reports it (CommitEvent.Final, the position with its tail),
// and every acked delivery's span ends with safeack.committed; when the
// coordinator refuses that commit until Close gives up, the final event's
// Err wraps ErrCommitNotConfirmed and the spans end with
// safeack.not_committed. Before, final commits were not reported: those
// spans never ended.
func TestFinalCommitsEndHeldSpans(t *testing.T) {
	for _, tc := range []struct {
		name       string
		partitions int
		refused    bool // the coordinator refuses every commit with a tail
		// cooperative: the members balance cooperatively; one of the
		// first member's partitions is revoked, the other kept.
		cooperative bool
		end         func(t *testing.T, c *kafkatest.Cluster, group, topic string, a *safeack.Subscriber)
	}{
		{"close", 1, false, false, func(t *testing.T, _ *kafkatest.Cluster, _, _ string, a *safeack.Subscriber) {
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"close, final commit refused", 1, true, false, func(t *testing.T, _ *kafkatest.Cluster, _, _ string, a *safeack.Subscriber) {
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"eager revocation", 2, false, false, secondMember(nil)},
		{"cooperative revocation", 2, false, true, secondMember(cooperative)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, topic, group := kafkatest.StartTopic(t, tc.partitions, kafkatest.Embedded())
			if tc.refused {
				c.RefuseCommits(group, kerr.CoordinatorLoadInProgress.Code, math.MaxInt32, func(rp kmsg.OffsetCommitRequestTopicPartition) bool {
					tail, err := frontier.DecodeTail(*cmp.Or(rp.Metadata, new(string)), rp.Offset)
					return err == nil && len(tail.Ranges) > 0
				})
			}
			tel := newTelemetry(t)
			obs, err := safeackotel.NewObserver(append(tel.options(), safeackotel.WithCommitEvents())...)
			if err != nil {
				t.Fatal(err)
			}
			log := &commitLog{Observer: obs}
			a := safeacktest.NewSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
				cfg.Observer = log
				cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = false
				cfg.CommitInterval = time.Hour // only early and final commits
				cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
				if tc.cooperative {
					cooperative(cfg)
				}
			})
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			msgs, err := a.Subscribe(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			const perPartition = 5
			var mu sync.Mutex
			acked := map[po]bool{}
			go func() {
				for m := range msgs {
					k := offsetOf(m)
					mu.Lock()
					_, seen := acked[k]
					acked[k] = false
					mu.Unlock()
					if k.o == 0 && !seen {
						continue // the head: never answered, the drain abandons it
					}
					m.Ack()
					mu.Lock()
					acked[k] = true
					mu.Unlock()
				}
			}()
			c.ProduceN(t, topic, tc.partitions, tc.partitions*perPartition, nil)
			ackedNow := func() map[po]bool {
				mu.Lock()
				defer mu.Unlock()
				out := map[po]bool{}
				for k, ok := range acked {
					if ok {
						out[k] = true
					}
				}
				return out
			}
			kafkatest.WaitFor(t, 15*time.Second, "every record but the heads acked", func() bool {
				return len(ackedNow()) == tc.partitions*(perPartition-1)
			})
			first := ackedNow()
			for k, ev := range lastEvents(tel.spans, topic) {
				if first[k] {
					t.Fatalf("the span of %v ended (%s) before any commit covered it", k, ev)
				}
			}

			tc.end(t, c, group, topic, a)
			ending := func() map[po]bool { return first }
			if tc.cooperative {
				// Only the revoked partition's assignment ends.
				var revoked int32
				kafkatest.WaitFor(t, 30*time.Second, "a partition revoked", func() bool {
					finals := log.finals()
					if len(finals) > 0 {
						revoked = finals[0].Partitions[0].Partition
					}
					return len(finals) > 0
				})
				ending = func() map[po]bool {
					out := map[po]bool{}
					for k := range first {
						if k.p == revoked {
							out[k] = true
						}
					}
					return out
				}
				if fs := log.finals(); len(fs) != 1 || len(fs[0].Partitions) != 1 {
					t.Fatalf("final events %+v; want one, of the revoked partition", fs)
				}
			}
			kafkatest.WaitFor(t, 30*time.Second, "every acked delivery's span ended", func() bool {
				ended := lastEvents(tel.spans, topic)
				for k := range ending() {
					if _, ok := ended[k]; !ok {
						return false
					}
				}
				return true
			})
			ended := lastEvents(tel.spans, topic)
			want := safeackotel.EventCommitted
			if tc.refused {
				want = safeackotel.EventNotCommitted
			}
			for k := range ending() {
				if ended[k] != want {
					t.Errorf("the span of acked %v ended with %q, want %s", k, ended[k], want)
				}
			}
			log.mu.Lock()
			for _, ev := range log.events {
				t.Logf("event: final %v err %v, partitions %+v", ev.Final, ev.Err, ev.Partitions)
			}
			log.mu.Unlock()
			t.Logf("spans %v", ended)
			for k := range ending() {
				if k.o != 1 {
					continue
				}
				p := k.p
				cp, held, ok := log.finalOf(p)
				if !ok {
					t.Fatalf("no final commit reported for partition %d", p)
				}
				if held == tc.refused || cp.Offset != 0 || cp.TailBytes == 0 || cp.Covers(0) || !cp.Covers(1) || !cp.Covers(perPartition-1) {
					t.Errorf("partition %d's final commit: %+v held %v; want held %v at 0 with a tail of 1..%d", p, cp, held, !tc.refused, perPartition-1)
				}
			}
			for _, ev := range log.finals() {
				if ev.Transactional || ev.Topic != topic || ev.Group != group || (ev.Err != nil) != tc.refused ||
					ev.Err != nil && !errors.Is(ev.Err, safeack.ErrCommitNotConfirmed) {
					t.Errorf("final event %+v", ev)
				}
			}
		})
	}
}

// secondMember returns a test's end that starts a second member of the
// group, configured by mod, that acks everything: the rebalance revokes
// partitions of the first.
func secondMember(mod func(*safeack.SubscriberConfig)) func(*testing.T, *kafkatest.Cluster, string, string, *safeack.Subscriber) {
	return func(t *testing.T, c *kafkatest.Cluster, group, topic string, _ *safeack.Subscriber) {
		b := safeacktest.NewSubscriber(t, c, group, mod)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		msgs, err := b.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for m := range msgs {
				m.Ack()
			}
		}()
	}
}

// cooperative makes a member balance cooperatively.
func cooperative(cfg *safeack.SubscriberConfig) {
	cfg.OverwriteSaramaConfig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
}

// TestTxnFinalCommitReported: in transactional mode the end of a
// partition's assignment (Close: the drain's transaction carries its final
// position, then the claim releases the partition) is reported as a final
// commit: the position the group holds, with its completed tail (acks out
// of order leave the head unanswered), and every acked delivery's span has
// ended with safeack.committed. Before, no final event came.
func TestTxnFinalCommitReported(t *testing.T) {
	t.Parallel()
	c, topic, group := kafkatest.StartTopic(t, 1, kafkatest.Embedded())
	tel := newTelemetry(t)
	obs, err := safeackotel.NewObserver(append(tel.options(), safeackotel.WithCommitEvents())...)
	if err != nil {
		t.Fatal(err)
	}
	log := &commitLog{Observer: obs}
	sub, _, err := safeack.NewTxnSubscriber(safeacktest.Config(c, group, func(cfg *safeack.SubscriberConfig) {
		cfg.Observer = log
		cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	}), safeack.TxnConfig{
		TransactionalID:       "final-" + group,
		CommitInterval:        time.Hour, // only the drain's transaction
		OverwriteSaramaConfig: c.SaramaConfig(),
	}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	const records = 5
	var mu sync.Mutex
	acked := map[po]bool{}
	go func() {
		for m := range msgs {
			k := offsetOf(m)
			if k.o == 0 {
				continue // the head: never answered
			}
			m.Ack()
			mu.Lock()
			acked[k] = true
			mu.Unlock()
		}
	}()
	c.ProduceN(t, topic, 1, records, nil)
	kafkatest.WaitFor(t, 15*time.Second, "every record but the head acked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == records-1
	})
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	cp, held, ok := log.finalOf(0)
	if !ok {
		t.Fatal("no final commit reported")
	}
	if !held || cp.Offset != 0 || cp.Covers(0) || !cp.Covers(1) || !cp.Covers(records-1) {
		t.Errorf("final commit %+v held %v; want held at 0 with a tail of 1..%d", cp, held, records-1)
	}
	for _, ev := range log.finals() {
		if !ev.Transactional || ev.Err != nil || len(ev.Partitions) != 1 {
			t.Errorf("final event %+v", ev)
		}
	}
	ended := lastEvents(tel.spans, topic)
	mu.Lock()
	defer mu.Unlock()
	for k := range acked {
		if ended[k] != safeackotel.EventCommitted {
			t.Errorf("the span of acked %v ended with %q, want %s", k, ended[k], safeackotel.EventCommitted)
		}
	}
}
