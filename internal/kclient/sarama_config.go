package kclient

import (
	"reflect"

	"github.com/IBM/sarama"
)

// builtinStrategies makes fresh instances of Sarama's balance strategies,
// by the name they report.
var builtinStrategies = map[string]func() sarama.BalanceStrategy{
	sarama.RangeBalanceStrategyName:             sarama.NewBalanceStrategyRange,
	sarama.RoundRobinBalanceStrategyName:        sarama.NewBalanceStrategyRoundRobin,
	sarama.StickyBalanceStrategyName:            sarama.NewBalanceStrategySticky,
	sarama.CooperativeStickyBalanceStrategyName: sarama.NewBalanceStrategyCooperativeSticky,
}

// freshStrategy returns a new instance of s when s is one of Sarama's own
// strategies, and s itself otherwise. Sarama's sticky strategies keep the
// last plan and the member's generation in the object, so one instance
// shared by several consumer groups races and mixes their state.
func freshStrategy(s sarama.BalanceStrategy) sarama.BalanceStrategy {
	if s == nil {
		return nil
	}
	mk, ok := builtinStrategies[s.Name()]
	if !ok {
		return s
	}
	fresh := mk()
	if reflect.TypeOf(fresh) != reflect.TypeOf(s) {
		return s // a strategy of the caller's own that reports a built-in name
	}
	return fresh
}

// CopySaramaConfig returns a copy of sc that shares nothing stateful with
// it: the caller may hand the same *sarama.Config to several subscribers,
// and one subscriber runs a consumer group per Subscribe call.
func CopySaramaConfig(sc *sarama.Config) *sarama.Config {
	c := *sc
	r := &c.Consumer.Group.Rebalance
	r.Strategy = freshStrategy(r.Strategy)
	if r.GroupStrategies != nil {
		gs := make([]sarama.BalanceStrategy, len(r.GroupStrategies))
		for i, s := range r.GroupStrategies {
			gs[i] = freshStrategy(s)
		}
		r.GroupStrategies = gs
	}
	return &c
}
