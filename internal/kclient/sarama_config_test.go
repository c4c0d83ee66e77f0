package kclient

import (
	"testing"

	"github.com/IBM/sarama"
)

// customStrategy is a BalanceStrategy of a user's own that reports a
// built-in name.
type customStrategy struct{ sarama.BalanceStrategy }

// TestCopySaramaConfigStrategies: each copy gets new instances of Sarama's
// own balance strategies, of the same kind; other strategies are kept.
func TestCopySaramaConfigStrategies(t *testing.T) {
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
	cp := CopySaramaConfig(orig)
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
	if s := CopySaramaConfig(orig).Consumer.Group.Rebalance.Strategy; s == sticky || s.Name() != sarama.StickyBalanceStrategyName {
		t.Errorf("deprecated Strategy: got %#v, want a new sticky strategy", s)
	}
}
