package consume

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/ready"
	"github.com/safeack/safeack/internal/sentinel"
)

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
// sentinel.ErrInstanceFenced and Sarama's ErrFencedInstancedId.
func (sub *subscription) fenced() error {
	id := sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId
	err := fmt.Errorf("%w: consumer group %q, instance id %q: %w", sentinel.ErrInstanceFenced, sub.cfg.ConsumerGroup, id, sarama.ErrFencedInstancedId)
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
	groupSession
}

func guardSession(sess groupSession) groupSession {
	if _, ok := sess.(fenceGuard); ok {
		return sess
	}
	return fenceGuard{sess}
}

func (g fenceGuard) fenced() bool { return sessionFenced(g.Context()) }

func (g fenceGuard) MarkOffset(topic string, partition int32, offset int64, metadata string) {
	if !g.fenced() {
		g.groupSession.MarkOffset(topic, partition, offset, metadata)
	}
}

func (g fenceGuard) ResetOffset(topic string, partition int32, offset int64, metadata string) {
	if !g.fenced() {
		g.groupSession.ResetOffset(topic, partition, offset, metadata)
	}
}

func (g fenceGuard) Commit() {
	if !g.fenced() {
		g.groupSession.Commit()
	}
}
