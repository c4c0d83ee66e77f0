package safeack

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/ready"
)

// ErrInstanceFenced is wrapped by what Ready and WaitReady report, and by
// the Error logged, for a subscription whose consumer group member was
// fenced: another consumer joined the group with the same
// Consumer.Group.InstanceId (static membership), so the group coordinator
// gave it this member and its partitions and answers this one
// FENCED_INSTANCE_ID. The subscription stops for good: it hands nothing
// more out and commits nothing more (acks of the messages it handed out
// change nothing; the new member handles those records again), its channel
// closes, and it does not rejoin, since a rejoin would fence the other
// consumer in turn and the two would take the partitions from each other
// for as long as both run. Give each live consumer its own InstanceId.
var ErrInstanceFenced = errors.New("safeack: consumer group member fenced by another consumer with the same Consumer.Group.InstanceId")

// fencedCause tells whether a session ended, or a join failed, because
// the coordinator fenced this member's instance id.
func fencedCause(err error) bool {
	return errors.Is(err, sarama.ErrFencedInstancedId)
}

// sessionFenced tells whether the coordinator fenced the session's member:
// Sarama cancels the session with that cause when a heartbeat or a commit
// is answered FENCED_INSTANCE_ID.
func sessionFenced(ctx context.Context) bool {
	return ctx != nil && fencedCause(context.Cause(ctx))
}

// fenced ends a subscription whose member was fenced: logged once as an
// Error, and reported by Ready until Close. The returned error wraps
// ErrInstanceFenced and Sarama's ErrFencedInstancedId.
func (sub *subscription) fenced() error {
	id := sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId
	err := fmt.Errorf("%w: consumer group %q, instance id %q: %w", ErrInstanceFenced, sub.cfg.ConsumerGroup, id, sarama.ErrFencedInstancedId)
	sub.logger.Error("Fenced: another consumer joined the group with this Consumer.Group.InstanceId and took its partitions; "+
		"this subscription stops (no more messages, no more commits, no rejoin) and its channel closes", err,
		sub.logFields.Add(watermill.LogFields{"instance_id": id}))
	sub.setPhase(ready.Fenced, err)
	return err
}

// fenceGuard is a group session whose marks and commits stop once the
// coordinator fenced its member: a commit then would only be refused
// again (each refusal logged by Sarama), and nothing the fenced member
// still completes is its to commit.
type fenceGuard struct {
	sarama.ConsumerGroupSession
}

func guardSession(sess sarama.ConsumerGroupSession) sarama.ConsumerGroupSession {
	if _, ok := sess.(fenceGuard); ok {
		return sess
	}
	return fenceGuard{sess}
}

func (g fenceGuard) fenced() bool { return sessionFenced(g.Context()) }

func (g fenceGuard) MarkOffset(topic string, partition int32, offset int64, metadata string) {
	if !g.fenced() {
		g.ConsumerGroupSession.MarkOffset(topic, partition, offset, metadata)
	}
}

func (g fenceGuard) ResetOffset(topic string, partition int32, offset int64, metadata string) {
	if !g.fenced() {
		g.ConsumerGroupSession.ResetOffset(topic, partition, offset, metadata)
	}
}

func (g fenceGuard) Commit() {
	if !g.fenced() {
		g.ConsumerGroupSession.Commit()
	}
}
