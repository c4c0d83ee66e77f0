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

// customStrategy is a BalanceStrategy of a user's own that reports a
// built-in name.
type customStrategy struct{ sarama.BalanceStrategy }

// TestCopySaramaConfigStrategies: each copy gets new instances of Sarama's
// own balance strategies, of the same kind; other strategies are kept.
func TestCopySaramaConfigStrategies(t *testing.T) {
	t.Parallel()
	own := customStrategy{sarama.NewBalanceStrategySticky()}
	orig := sarama.NewConfig()
	orig.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{
		sarama.NewBalanceStrategyRange(),
		sarama.NewBalanceStrategyRoundRobin(),
		sarama.NewBalanceStrategySticky(),
		sarama.NewBalanceStrategyCooperativeSticky(),
		own,
	}
	before := append([]sarama.BalanceStrategy(nil), orig.Consumer.Group.Rebalance.GroupStrategies...)
	cp := copySaramaConfig(orig)
	got := cp.Consumer.Group.Rebalance.GroupStrategies
	if len(got) != len(before) {
		t.Fatalf("%d strategies, want %d", len(got), len(before))
	}
	for i, s := range got {
		if s.Name() != before[i].Name() {
			t.Errorf("strategy %d: %q, want %q", i, s.Name(), before[i].Name())
		}
		if orig.Consumer.Group.Rebalance.GroupStrategies[i] != before[i] {
			t.Errorf("strategy %d of the caller's config was replaced", i)
		}
	}
	for _, i := range []int{0, 2, 3} { // roundrobin is an empty struct: every pointer to one may be equal
		if got[i] == before[i] {
			t.Errorf("strategy %d (%s) is shared with the caller's config", i, got[i].Name())
		}
	}
	if got[4] != own {
		t.Errorf("a custom strategy was replaced: %#v", got[4])
	}

	orig = sarama.NewConfig()
	sticky := sarama.NewBalanceStrategySticky()
	orig.Consumer.Group.Rebalance.Strategy = sticky // deprecated, still honoured by Sarama
	if s := copySaramaConfig(orig).Consumer.Group.Rebalance.Strategy; s == sticky || s.Name() != sarama.StickyBalanceStrategyName {
		t.Errorf("deprecated Strategy: got %#v, want a new sticky strategy", s)
	}
}
