package consume

import (
	"github.com/IBM/sarama"

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

func (r saramaReads) LeaderEpoch(partition int32) (int32, error) {
	_, e, err := r.client.LeaderAndEpoch(r.topic, partition)
	return e, err
}
