package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// errNoEpochAnswer is the error of a check the leader's answer left the
// partition out of.
var errNoEpochAnswer = errors.New("OffsetForLeaderEpoch: no answer for the partition")

// epochClient sends the leader-epoch checks of one consumer group: a
// franz-go client (Sarama has no OffsetForLeaderEpoch request), made at the
// first check and kept until the group is closed, so that a cooperative
// rebalance handing over many partitions (each checked by its claim) costs
// no client per partition.
type epochClient struct {
	// connection returns the options that reach the cluster: the engine's
	// connection settings and seed brokers (see kgoConnection).
	connection func() ([]kgo.Opt, error)
	// client, when set, is a franz-go client the subscription has
	// already (the consumer protocol's, see connectKgo): it sends the
	// checks, and is not the epochClient's to close.
	client *kgo.Client

	mu sync.Mutex
	cl *kgo.Client
}

// get returns the franz-go client, making it if need be.
func (e *epochClient) get() (*kgo.Client, error) {
	if e.client != nil {
		return e.client, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cl != nil {
		return e.cl, nil
	}
	opts, err := e.connection()
	if err != nil {
		return nil, fmt.Errorf("leader-epoch check: %w", err)
	}
	opts = append(opts, kgo.RetryTimeout(epochCheckTimeout))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	e.cl = cl
	return cl, nil
}

// close closes the franz-go client, if one was made.
func (e *epochClient) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cl != nil {
		e.cl.Close()
		e.cl = nil
	}
}

// offsetForLeaderEpoch asks the partitions' leaders where each epoch ends.
func (e *epochClient) offsetForLeaderEpoch(ctx context.Context, topic string, epochs map[int32]int32) map[int32]epochAnswer {
	out := make(map[int32]epochAnswer, len(epochs))
	fail := func(err error, final bool) map[int32]epochAnswer {
		for p := range epochs {
			out[p] = epochAnswer{endOffset: -1, err: err, final: final}
		}
		return out
	}
	cl, err := e.get()
	if err != nil {
		return fail(err, true)
	}

	req := kmsg.NewPtrOffsetForLeaderEpochRequest()
	req.ReplicaID = -1 // a consumer
	rt := kmsg.NewOffsetForLeaderEpochRequestTopic()
	rt.Topic = topic
	for p, e := range epochs {
		rp := kmsg.NewOffsetForLeaderEpochRequestTopicPartition()
		rp.Partition = p
		rp.CurrentLeaderEpoch = -1 // no fencing: the answer is read, nothing is fetched
		rp.LeaderEpoch = e
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fail(fmt.Errorf("OffsetForLeaderEpoch: %w", err), nonRetriable(err))
	}
	for _, t := range resp.Topics {
		if t.Topic != topic {
			continue
		}
		for _, rp := range t.Partitions {
			if _, asked := epochs[rp.Partition]; !asked {
				continue
			}
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				out[rp.Partition] = epochAnswer{endOffset: -1, err: fmt.Errorf("OffsetForLeaderEpoch: %w", err), final: nonRetriable(err)}
				continue
			}
			end := rp.EndOffset
			if rp.LeaderEpoch < 0 {
				end = -1 // the leader knows no epoch at or below the one asked for
			}
			out[rp.Partition] = epochAnswer{endOffset: end}
		}
	}
	return out
}

// nonRetriable reports whether err is a Kafka error that trying again
// does not cure (an authorization failure, an unsupported version).
func nonRetriable(err error) bool {
	var ke *kerr.Error
	return errors.As(err, &ke) && !ke.Retriable
}
