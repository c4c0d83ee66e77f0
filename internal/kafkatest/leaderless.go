package kafkatest

import (
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Leaderless makes the embedded broker answer for the given partitions of
// topic as a real cluster does while the only replica of each is down,
// until the returned function is called: Metadata lists them with
// LEADER_NOT_AVAILABLE and leader -1 (Kafka's answer for an offline
// partition), and ListOffsets and Fetch for them are refused with
// NOT_LEADER_OR_FOLLOWER, as a live broker that does not lead them refuses
// a client whose metadata is older. The other partitions keep their leaders.
//
// The Metadata answer is made from the topic's partitions and leaders as
// they are when Leaderless is called. A Metadata request that names topic,
// or asks for every topic, is answered with topic alone (tests using it
// should have one topic); the others go on to the broker. Embedded broker
// only (see RequireEmbedded).
func (c *Cluster) Leaderless(tb testing.TB, topic string, partitions ...int32) (restore func()) {
	tb.Helper()
	c.RequireEmbedded(tb)
	kf := c.kf
	info := kf.TopicInfo(topic)
	if info == nil {
		tb.Fatalf("kafkatest: Leaderless: no topic %s", topic)
	}
	parts := kf.PartitionInfos(topic)
	brokers := make([]kmsg.MetadataResponseBroker, 0, len(c.brokers))
	for i, addr := range c.brokers {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			tb.Fatalf("kafkatest: Leaderless: broker address %q: %v", addr, err)
		}
		p, _ := strconv.Atoi(port)
		b := kmsg.NewMetadataResponseBroker()
		b.NodeID, b.Host, b.Port = int32(i), host, int32(p) // kfake numbers its nodes from 0, in address order
		brokers = append(brokers, b)
	}
	replicas := min(max(info.NumReplicas, 1), len(brokers))

	var on atomic.Bool
	on.Store(true)
	kf.ControlKey(kmsg.Metadata.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		mr := req.(*kmsg.MetadataRequest)
		if !on.Load() || !namesTopic(mr, topic) {
			return nil, nil, false
		}
		resp := mr.ResponseKind().(*kmsg.MetadataResponse)
		resp.SetVersion(mr.GetVersion())
		resp.Brokers = slices.Clone(brokers)
		resp.ControllerID = 0
		st := kmsg.NewMetadataResponseTopic()
		st.Topic = kmsg.StringPtr(topic)
		st.TopicID = info.TopicID
		for _, pi := range parts {
			sp := kmsg.NewMetadataResponseTopicPartition()
			sp.Partition = pi.Partition
			sp.LeaderEpoch = pi.Epoch
			for i := range replicas {
				sp.Replicas = append(sp.Replicas, (pi.Leader+int32(i))%int32(len(brokers)))
			}
			if slices.Contains(partitions, pi.Partition) {
				sp.ErrorCode = kerr.LeaderNotAvailable.Code
				sp.Leader = -1
				sp.OfflineReplicas = slices.Clone(sp.Replicas)
			} else {
				sp.Leader = pi.Leader
				sp.ISR = slices.Clone(sp.Replicas)
			}
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})
	refused := kf.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.ListOffsets, kmsg.Fetch}, Topic: topic, Partitions: partitions,
		Err: kerr.NotLeaderForPartition, Count: -1,
	})
	var once atomic.Bool
	restore = func() {
		if once.CompareAndSwap(false, true) {
			on.Store(false)
			refused.Remove()
		}
	}
	tb.Cleanup(restore)
	return restore
}

// namesTopic reports whether a Metadata request asks for topic: by name,
// or by asking for every topic.
func namesTopic(req *kmsg.MetadataRequest, topic string) bool {
	if req.Topics == nil {
		return true
	}
	for _, t := range req.Topics {
		if t.Topic != nil && *t.Topic == topic {
			return true
		}
	}
	return false
}
