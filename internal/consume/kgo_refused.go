package consume

// A consumer-protocol member that the coordinator keeps out of a classic
// group. Moving a running group from the classic protocol to the consumer
// protocol member by member needs the broker to convert the group while
// classic members are in it (Kafka's group.consumer.migration.policy,
// "bidirectional" by default on Kafka 4.x); a broker that does not
// (policy "disabled" or "downgrade", or the embedded kfake broker) answers
// the new member's join GROUP_ID_NOT_FOUND until the last classic member
// left, and franz-go retries the join. The member waits outside the group
// meanwhile: Ready says why, and the log says it once in a while rather
// than as a fetch error at each retry.

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/ready"
)

// refusedJoinLogEvery spaces the log lines of a join the coordinator keeps
// refusing.
const refusedJoinLogEvery = 30 * time.Second

// joinRefusals remembers when a refused join was last logged.
type joinRefusals struct {
	mu     sync.Mutex
	logged time.Time
}

// refusedJoin tells whether err, a fetch error kgo reported, is the
// coordinator refusing the member's join into a classic group; if so, it
// reports the wait through Ready and the log.
func (g *kgoGroup) refusedJoin(err error) bool {
	var session *kgo.ErrGroupSession
	if !errors.As(err, &session) || !errors.Is(err, kerr.GroupIDNotFound) {
		return false
	}
	if _, epoch := g.cl.GroupMetadata(); epoch > 0 {
		return false // joined meanwhile
	}
	why := fmt.Errorf("the group coordinator does not take this consumer-protocol member into consumer group %q: "+
		"it is a classic group with members, and the broker does not move a group with members to the consumer protocol "+
		"(Kafka's group.consumer.migration.policy must be upgrade or bidirectional, Kafka 4.x's default); "+
		"the member joins once the group's classic members have left: %w", g.sub.cfg.ConsumerGroup, err)
	g.sub.setPhase(ready.Joining, why)
	g.refusals.mu.Lock()
	due := time.Since(g.refusals.logged) >= refusedJoinLogEvery
	if due {
		g.refusals.logged = time.Now()
	}
	g.refusals.mu.Unlock()
	if due {
		g.sub.logger.Error("Waiting to join the consumer group", why, g.sub.logFields.Add(watermill.LogFields{
			"retrying": "until the classic members left; logged again in " + refusedJoinLogEvery.String() + " if it lasts"}))
	}
	return true
}
