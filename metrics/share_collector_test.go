package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/metrics"
)

// TestShareCollectorReportsStats: a ShareCollector exports a
// ShareSubscriber's Stats: one record accepted, one released and accepted
// on its second delivery, one held (in flight, with its offset and age).
func TestShareCollectorReportsStats(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	topic := c.NewTopic(t, 1)
	sub, err := safeack.NewShareSubscriber(safeack.ShareSubscriberConfig{
		Brokers:       c.Brokers(),
		ShareGroup:    c.NewGroup(t),
		InitialOffset: sarama.OffsetOldest,
		// One handler for the held record, one for the others.
		Members:        2,
		MaxInFlight:    2,
		MaxPollRecords: 1,
		DrainTimeout:   100 * time.Millisecond,
	}, testLogger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Skipf("share groups: %v", err) // a real cluster before Kafka 4.2
	}
	c.Produce(t, topic,
		kafkatest.Record{Value: []byte("ack")},
		kafkatest.Record{Value: []byte("nack")},
		kafkatest.Record{Value: []byte("hold")},
	)
	go func() {
		for m := range msgs {
			dc, _ := safeack.MessageDeliveryCountFromCtx(m.Context())
			switch string(m.Payload) {
			case "hold":
			case "nack":
				if dc == 1 {
					m.Nack()
					continue
				}
				m.Ack()
			default:
				m.Ack()
			}
		}
	}()
	kafkatest.WaitFor(t, 20*time.Second, "two accepted, one released, one held", func() bool {
		st := sub.Stats()
		return len(st) == 1 && st[0].Accepted == 2 && st[0].Released == 1 && st[0].InFlight == 1
	})

	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(metrics.NewShareCollector(sub)))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var v float64
			switch {
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			}
			got[f.GetName()] = v
		}
	}
	for name, want := range map[string]float64{
		"safeack_in_flight_messages":                    1,
		"safeack_oldest_unfinished_offset":              2,
		"safeack_offered_records_total":                 4,
		"safeack_share_accepted_records_total":          2,
		"safeack_share_released_records_total":          1,
		"safeack_share_rejected_records_total":          0,
		"safeack_share_redelivered_records_total":       1,
		"safeack_share_max_delivery_count":              2,
		"safeack_share_released_at_close_records_total": 0,
	} {
		assert.Equal(t, want, got[name], name)
	}
	assert.Positive(t, got["safeack_oldest_unfinished_age_seconds"])
}
