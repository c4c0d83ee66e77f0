package safeack

import (
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/safeack/safeack/internal/kclient"
)

// PartitionOffset returns, per partition of topic, the offset the next
// record produced to it will get (its high-water mark), as
// watermill-kafka's Subscriber.PartitionOffset does. It opens a Sarama
// client of its own for the call. It says nothing about what a consumer
// group committed: see Stats for that.
func (s *Subscriber) PartitionOffset(topic string) (kafka.PartitionOffset, error) {
	client, err := sarama.NewClient(s.cfg.Brokers, kclient.CopySaramaConfig(s.cfg.OverwriteSaramaConfig))
	if err != nil {
		return nil, fmt.Errorf("cannot create new Sarama client: %w", err)
	}
	out, err := partitionOffsets(client, topic)
	if cerr := client.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("closing Sarama client: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func partitionOffsets(client sarama.Client, topic string) (kafka.PartitionOffset, error) {
	partitions, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("cannot get partitions of topic %q: %w", topic, err)
	}
	out := make(kafka.PartitionOffset, len(partitions))
	for _, p := range partitions {
		off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("cannot get the newest offset of %s/%d: %w", topic, p, err)
		}
		out[p] = off
	}
	return out, nil
}
