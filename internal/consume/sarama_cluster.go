package consume

import (
	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/kclient"
)

// saramaReads is clusterReads through a Sarama client.
type saramaReads struct {
	client       sarama.Client
	group, topic string
}

var _ clusterReads = saramaReads{}

func (r saramaReads) Committed(partitions []int32) (map[int32]kclient.CommittedOffset, error) {
	return kclient.FetchCommitted(r.client, r.group, r.topic, partitions)
}

func (r saramaReads) CommittedOnce(partitions []int32) (map[int32]kclient.CommittedOffset, error) {
	return kclient.FetchCommittedOnce(r.client, r.group, r.topic, partitions)
}

func (r saramaReads) LogStart(partition int32) (int64, error) {
	return r.client.GetOffset(r.topic, partition, sarama.OffsetOldest)
}

func (r saramaReads) HighWaterMarks(partitions []int32) (map[int32]int64, map[int32]error) {
	return kclient.ListOffsetsOnce(r.client, r.topic, partitions, sarama.OffsetNewest)
}

func (r saramaReads) ListOffsets(partitions []int32, at int64) (map[int32]int64, map[int32]error) {
	return kclient.ListOffsets(r.client, r.topic, partitions, at)
}

func (r saramaReads) LeaderEpoch(partition int32) (int32, error) {
	_, e, err := r.client.LeaderAndEpoch(r.topic, partition)
	return e, err
}

// kgoConnection returns the franz-go options that reach client's cluster:
// the connection settings of its Sarama config (TLS, SASL PLAIN, SCRAM and
// OAUTHBEARER, proxy, local address: kclient.KgoOptions; a SASL mechanism
// that cannot be carried over, GSSAPI, is an error) and the brokers it
// knows, or seeds when it knows none.
func kgoConnection(client sarama.Client, seeds []string) func() ([]kgo.Opt, error) {
	return func() ([]kgo.Opt, error) {
		opts, err := kclient.KgoOptions(client.Config())
		if err != nil {
			return nil, err
		}
		addrs := make([]string, 0, 3)
		for _, b := range client.Brokers() {
			addrs = append(addrs, b.Addr())
		}
		if len(addrs) == 0 {
			addrs = seeds
		}
		return append(opts, kgo.SeedBrokers(addrs...)), nil
	}
}
