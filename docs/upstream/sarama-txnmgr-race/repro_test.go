//go:build saramarace

// Package repro reproduces a data race in Sarama's transaction manager
// (transactionManager.lastError) when a transactional producer is fenced
// while a SendMessages call has batches for several partitions to send.
// See ../sarama-txnmgr-race.md. Run:
//
//	go test -race -tags saramarace -count=1 ./docs/upstream/sarama-txnmgr-race/
package repro

import (
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

func TestFencedMidSendRace(t *testing.T) {
	const topic, partitions = "out", 8
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()

	config := func() *sarama.Config {
		c := sarama.NewConfig()
		c.Version = sarama.V2_8_0_0
		c.Producer.Idempotent = true
		c.Producer.RequiredAcks = sarama.WaitForAll
		c.Producer.Return.Successes = true
		c.Producer.Return.Errors = true
		c.Producer.Partitioner = sarama.NewManualPartitioner
		c.Producer.Retry.Backoff = time.Millisecond
		c.Producer.Transaction.ID = "fenced"
		c.Net.MaxOpenRequests = 1
		return c
	}

	for round := range 20 {
		p, err := sarama.NewSyncProducer(kf.ListenAddrs(), config())
		if err != nil {
			t.Fatal(err)
		}
		if err := p.BeginTxn(); err != nil {
			t.Fatal(err)
		}
		msgs := make([]*sarama.ProducerMessage, 4000)
		for i := range msgs {
			msgs[i] = &sarama.ProducerMessage{
				Topic: topic, Partition: int32(i % partitions),
				Value: sarama.StringEncoder(fmt.Sprint(round, "-", i)),
			}
		}
		sent := make(chan error, 1)
		go func() { sent <- p.SendMessages(msgs) }()

		// A second producer with the same transactional id bumps the
		// epoch (InitProducerId): the first one is fenced mid-send.
		fencer, err := sarama.NewSyncProducer(kf.ListenAddrs(), config())
		if err != nil {
			t.Fatal(err)
		}
		_ = fencer.Close()

		if err := <-sent; err == nil {
			t.Logf("round %d: the send finished before the fence", round)
		}
		_ = p.AbortTxn()
		_ = p.Close()
	}
}
