package metrics_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/safeack/safeack/internal/kafkatest"
	"github.com/safeack/safeack/metrics"
)

// unclaimedPartitions returns the partition labels of the
// safeack_unclaimed_seconds series reg gathers, failing on a series whose
// value is not positive.
func unclaimedPartitions(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "safeack_unclaimed_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetGauge().GetValue(); v <= 0 {
				t.Errorf("safeack_unclaimed_seconds = %v, want a positive age", v)
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == "partition" {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	return out
}

// A partition assigned to the member while it has no leader has a
// safeack_unclaimed_seconds series, and loses it once it is consumed again
// (the root package's unclaimed-partition tests check the figure itself,
// through internal/figures; this checks the exposition).
func TestCollectorUnclaimed(t *testing.T) {
	c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
	c.ProduceN(t, topic, 2, 4, nil)
	restore := c.Leaderless(t, topic, 1)

	sub := newSubscriber(t, c, group)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(sub))
	msgs, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	go (&consumer{}).run(msgs)

	kafkatest.WaitFor(t, 30*time.Second, "partition 1 to be exported as unclaimed", func() bool {
		got := unclaimedPartitions(t, reg)
		return len(got) == 1 && got[0] == "1"
	})
	restore()
	kafkatest.WaitFor(t, 30*time.Second, "partition 1's unclaimed series to go", func() bool {
		return len(unclaimedPartitions(t, reg)) == 0 && len(sub.Unclaimed()) == 0
	})
}
