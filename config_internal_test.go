package safeack

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
)

// TestDefaultDrainTimeout: an unset DrainTimeout stays below a short
// Rebalance.Timeout, so a Sarama config Sarama accepts is accepted; an
// explicit one is kept (and refused when too long).
func TestDefaultDrainTimeout(t *testing.T) {
	t.Parallel()
	withRebalance := func(d time.Duration) *sarama.Config {
		c := DefaultSaramaSubscriberConfig()
		c.Consumer.Group.Rebalance.Timeout = d
		return c
	}
	for _, tc := range []struct {
		name    string
		cfg     SubscriberConfig
		want    time.Duration
		invalid bool
	}{
		{"Sarama's default", SubscriberConfig{ConsumerGroup: "g"}, DefaultDrainTimeout, false},
		{"short rebalance", SubscriberConfig{ConsumerGroup: "g", OverwriteSaramaConfig: withRebalance(3 * time.Second)}, 1500 * time.Millisecond, false},
		{"rebalance just above the default", SubscriberConfig{ConsumerGroup: "g", OverwriteSaramaConfig: withRebalance(6 * time.Second)}, 3 * time.Second, false},
		{"no group", SubscriberConfig{OverwriteSaramaConfig: withRebalance(3 * time.Second)}, DefaultDrainTimeout, false},
		{"explicit and too long", SubscriberConfig{ConsumerGroup: "g", DrainTimeout: 4 * time.Second, OverwriteSaramaConfig: withRebalance(3 * time.Second)}, 4 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Brokers = []string{"127.0.0.1:9092"}
			if got := tc.cfg.withDefaults().DrainTimeout; got != tc.want {
				t.Errorf("DrainTimeout = %v, want %v", got, tc.want)
			}
			if err := tc.cfg.Validate(); (err != nil) != tc.invalid {
				t.Errorf("Validate() = %v, want an error: %v", err, tc.invalid)
			}
		})
	}
}

// TestOTELEnabledSetsTracer: OTELEnabled means watermill-kafka's OTEL
// tracer, unless a Tracer is given.
func TestOTELEnabledSetsTracer(t *testing.T) {
	t.Parallel()
	if tr := (SubscriberConfig{OTELEnabled: true}).withDefaults().Tracer; tr != kafka.NewOTELSaramaTracer() {
		t.Errorf("OTELEnabled: Tracer = %#v, want kafka.OTELSaramaTracer", tr)
	}
	if tr := (SubscriberConfig{}).withDefaults().Tracer; tr != nil {
		t.Errorf("no OTELEnabled: Tracer = %#v, want nil", tr)
	}
	own := customTracer{}
	if tr := (SubscriberConfig{OTELEnabled: true, Tracer: own}).withDefaults().Tracer; tr != own {
		t.Errorf("OTELEnabled with a Tracer: Tracer = %#v, want the given one", tr)
	}
}

type customTracer struct{ kafka.OTELSaramaTracer }
