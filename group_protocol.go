package safeack

import (
	"fmt"

	"github.com/IBM/sarama"
)

// GroupProtocol is the consumer group protocol a Subscriber's
// ConsumerGroup runs (SubscriberConfig.GroupProtocol).
type GroupProtocol int

const (
	// GroupProtocolClassic is Kafka's classic group protocol on Sarama's
	// consumer group: members join and sync, the group leader assigns
	// with Sarama's balance strategies (Consumer.Group.Rebalance), and an
	// eager rebalance stops every member. The zero value.
	GroupProtocolClassic GroupProtocol = iota
	// GroupProtocolConsumer is the consumer group protocol (KIP-848,
	// Kafka 4.0+; 4.3+ recommended) on franz-go: the group coordinator
	// assigns (RemoteAssignor), each member reconciles on its own
	// heartbeat, and a member joining or leaving moves only the partitions
	// that must move. A revoked partition drains and commits before the
	// member acknowledges the revocation. NewTxnSubscriber refuses it.
	GroupProtocolConsumer
)

// String names the protocol as Kafka's group.protocol does.
func (p GroupProtocol) String() string {
	switch p {
	case GroupProtocolClassic:
		return "classic"
	case GroupProtocolConsumer:
		return "consumer"
	}
	return fmt.Sprintf("GroupProtocol(%d)", int(p))
}

// RemoteAssignor is the group coordinator's assignor under
// GroupProtocolConsumer (Kafka's group.remote.assignor).
type RemoteAssignor string

const (
	// RemoteAssignorUniform spreads the partitions evenly and moves as
	// few as it can (the default).
	RemoteAssignorUniform RemoteAssignor = "uniform"
	// RemoteAssignorRange gives each member a contiguous range of each
	// topic's partitions.
	RemoteAssignorRange RemoteAssignor = "range"
)

// validateGroupProtocol refuses a GroupProtocol or RemoteAssignor it does
// not know, and, with GroupProtocolConsumer, the settings the consumer
// protocol moves to the broker or has no place for: set to anything but
// Sarama's defaults, they would otherwise be silently dropped.
func (c SubscriberConfig) validateGroupProtocol() error {
	switch c.GroupProtocol {
	case GroupProtocolClassic:
		if c.RemoteAssignor != "" {
			return fieldError("RemoteAssignor", "%q is for GroupProtocolConsumer; with GroupProtocolClassic the group's assignors are Sarama's (Consumer.Group.Rebalance.GroupStrategies)", c.RemoteAssignor)
		}
		return nil
	case GroupProtocolConsumer:
	default:
		return fieldError("GroupProtocol", "unknown protocol %d", int(c.GroupProtocol))
	}
	switch c.RemoteAssignor {
	case "", RemoteAssignorUniform, RemoteAssignorRange:
	default:
		return fieldError("RemoteAssignor", "unknown assignor %q: the broker's are %q and %q", c.RemoteAssignor, RemoteAssignorUniform, RemoteAssignorRange)
	}
	if c.ConsumerGroup == "" {
		return fieldError("GroupProtocol", "GroupProtocolConsumer needs a ConsumerGroup")
	}
	if c.Tracer != nil {
		return fieldError("GroupProtocol", "Tracer (or OTELEnabled) wraps Sarama's ConsumerGroupHandler, which GroupProtocolConsumer does not run; use an Observer")
	}
	def := sarama.NewConfig().Consumer.Group
	g := c.OverwriteSaramaConfig.Consumer.Group
	moved := func(setting string, v any) error {
		return fieldError("OverwriteSaramaConfig", "Consumer.Group.%s is %v: with GroupProtocolConsumer the group coordinator sets it (group.consumer.* broker configs); leave Sarama's default", setting, v)
	}
	switch {
	case g.Session.Timeout != def.Session.Timeout:
		return moved("Session.Timeout", g.Session.Timeout)
	case g.Heartbeat.Interval != def.Heartbeat.Interval:
		return moved("Heartbeat.Interval", g.Heartbeat.Interval)
	case g.Rebalance.Strategy != nil:
		return moved("Rebalance.Strategy", g.Rebalance.Strategy.Name())
	case len(g.Rebalance.GroupStrategies) != 1 || g.Rebalance.GroupStrategies[0].Name() != sarama.RangeBalanceStrategyName:
		return fieldError("OverwriteSaramaConfig", "Consumer.Group.Rebalance.GroupStrategies is set: with GroupProtocolConsumer the coordinator assigns; choose its assignor with RemoteAssignor")
	case len(g.Member.UserData) > 0:
		return fieldError("OverwriteSaramaConfig", "Consumer.Group.Member.UserData is set: the consumer protocol carries no member user data")
	case len(c.OverwriteSaramaConfig.Consumer.Interceptors) > 0:
		return fieldError("OverwriteSaramaConfig", "Consumer.Interceptors is set: with GroupProtocolConsumer the records are fetched by franz-go, not by Sarama's consumer, which runs the interceptors")
	}
	return nil
}
