package consume

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/ready"
)

// The consumer-protocol member's readiness: joined once the coordinator
// took it in, not ready while its heartbeats fail to reach the coordinator.

// watchJoined tells Ready the member consumes once the coordinator took
// it in (a member epoch above 0), with or without partitions, as a
// classic session's start does; until ctx ends.
func (g *kgoGroup) watchJoined(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if _, epoch := g.cl.GroupMetadata(); epoch > 0 {
			g.joined.Store(true)
			g.sub.setPhase(ready.Consuming, nil)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// heartbeatLog keeps whether the member's heartbeats reach its
// coordinator: since when they fail (the request's connection to the
// coordinator failed or broke: the broker is gone, the network cut),
// until one is answered again (whatever its error code: the coordinator is
// there). Silence alone is no sign: the coordinator sets the interval
// (5 s by default on Kafka, up to group.consumer.max.heartbeat.interval.ms).
type heartbeatLog struct {
	mu           sync.Mutex
	coordinator  int32 // the node that last answered a heartbeat
	answered     bool  // one did
	failingSince time.Time
	silent       bool // the member reported the coordinator unreachable (see watchHeartbeats)
}

func (l *heartbeatLog) OnBrokerE2E(meta kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key != int16(kmsg.ConsumerGroupHeartbeat) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e2e.Err() != nil {
		l.failing()
		return
	}
	l.coordinator, l.answered, l.failingSince = meta.NodeID, true, time.Time{}
}

// OnBrokerConnect counts a failed connection to the coordinator as a
// failed heartbeat: franz-go sends none on a connection it cannot open.
func (l *heartbeatLog) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.answered && meta.NodeID == l.coordinator {
		l.failing()
	}
}

// failing notes a failed heartbeat. Callers hold mu.
func (l *heartbeatLog) failing() {
	if l.failingSince.IsZero() {
		l.failingSince = time.Now()
	}
}

var (
	_ kgo.HookBrokerE2E     = (*heartbeatLog)(nil)
	_ kgo.HookBrokerConnect = (*heartbeatLog)(nil)
)

// heartbeatsFailFor is how long the member's heartbeats fail before Ready
// reports the coordinator unreachable: franz-go's own retries of a
// request to a broker that restarts or moves take about this long.
const heartbeatsFailFor = 2 * time.Second

// unreachable reports for how long the member's heartbeats have failed,
// once past heartbeatsFailFor (0 otherwise), and whether the member
// reported it before.
func (l *heartbeatLog) unreachable(now time.Time) (since time.Duration, reported bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failingSince.IsZero() {
		return 0, l.silent
	}
	if d := now.Sub(l.failingSince); d > heartbeatsFailFor {
		return d, l.silent
	}
	return 0, l.silent
}

func (l *heartbeatLog) setSilent(silent bool) {
	l.mu.Lock()
	l.silent = silent
	l.mu.Unlock()
}

// watchHeartbeats tells Ready the member is not consuming while its
// heartbeats cannot reach its coordinator (the brokers went away, the
// network is cut): franz-go keeps its membership and tries again on its
// own, and the member consumes again once the coordinator answers (its
// partitions may have moved meanwhile, see lost). The classic engine's
// session ends instead, and its subscription reconnects: Ready says so
// alike.
func (g *kgoGroup) watchHeartbeats(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		since, reported := g.heartbeats.unreachable(time.Now())
		switch {
		case since > 0 && !reported && g.joined.Load():
			g.heartbeats.setSilent(true)
			err := fmt.Errorf("the member's heartbeats have not reached the group coordinator for %v; franz-go tries again",
				since.Round(time.Millisecond))
			g.sub.logger.Error("Consumer group coordinator unreachable", err, g.sub.logFields)
			g.sub.setPhase(ready.Connecting, err)
		case since == 0 && reported:
			g.heartbeats.setSilent(false)
			g.sub.logger.Info("The group coordinator answers the member's heartbeats again", g.sub.logFields)
			if _, epoch := g.cl.GroupMetadata(); epoch > 0 {
				g.sub.setPhase(ready.Consuming, nil)
			} else {
				g.sub.setPhase(ready.Joining, nil)
			}
		}
	}
}
