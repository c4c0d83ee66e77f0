package safeack_test

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// coordinatorRequests are the requests only the group coordinator answers.
var coordinatorRequests = []kmsg.Key{
	kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup, kmsg.OffsetCommit, kmsg.OffsetFetch,
}

// coordinatorOutage makes the embedded broker's group coordinator
// unavailable while down is set, in one of two ways: "dead" closes the
// connection of every coordinator request (a coordinator that died: Sarama
// returns a JoinGroup's connection error at once), "moved" answers them
// NOT_COORDINATOR (Sarama retries that Rebalance.Retry.Max times, then
// returns it; offset requests are answered as usual). It records the member id of every JoinGroup and counts
// those refused.
type coordinatorOutage struct {
	down    atomic.Bool
	refused atomic.Int32 // JoinGroups refused while down

	mu      sync.Mutex
	joinIDs []string // MemberID of every JoinGroup request, in order
}

func newCoordinatorOutage(t *testing.T, kf *kfake.Cluster, group, kind string) *coordinatorOutage {
	t.Helper()
	o := &coordinatorOutage{}
	for _, key := range coordinatorRequests {
		kf.ControlKey(key.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			kf.KeepControl()
			down := o.down.Load()
			if jg, ok := req.(*kmsg.JoinGroupRequest); ok && jg.Group == group {
				o.mu.Lock()
				o.joinIDs = append(o.joinIDs, jg.MemberID)
				o.mu.Unlock()
				if down {
					o.refused.Add(1)
				}
			}
			if !down {
				return nil, nil, false
			}
			offsets := key == kmsg.OffsetCommit || key == kmsg.OffsetFetch
			switch {
			case kind == "moved" && offsets:
				return nil, nil, false // offsets work on: only membership moved
			case kind == "dead":
				return nil, errors.New("coordinator down"), true
			case kind == "moved":
				resp := req.ResponseKind()
				resp.SetVersion(req.GetVersion())
				if err := setErrorCode(resp, kerr.NotCoordinator.Code); err != nil {
					t.Errorf("control: %v", err)
				}
				return resp, nil, true
			}
			t.Errorf("unknown outage kind %q", kind)
			return nil, nil, false
		})
	}
	return o
}

// setErrorCode sets the top-level error code of a fresh response to a
// group membership request.
func setErrorCode(resp kmsg.Response, code int16) error {
	switch r := resp.(type) {
	case *kmsg.JoinGroupResponse:
		r.ErrorCode = code
	case *kmsg.SyncGroupResponse:
		r.ErrorCode = code
	case *kmsg.HeartbeatResponse:
		r.ErrorCode = code
	case *kmsg.LeaveGroupResponse:
		r.ErrorCode = code
	default:
		return errors.New("unexpected response type")
	}
	return nil
}

func (o *coordinatorOutage) joins() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.joinIDs)
}

// TestCoordinatorLossKeepsMemberID: when the group coordinator is gone
// (connections refused, or NOT_COORDINATOR past Sarama's own retries),
// Consume fails; the subscription rejoins with the same Sarama consumer
// group, so the group keeps its member id and does not wait for an
// orphaned member's session to expire. Nothing acked is lost, no commit
// passes an unacked record, and Close during an outage returns promptly.
func TestCoordinatorLossKeepsMemberID(t *testing.T) {
	skipOnConsumerProtocol(t, "Sarama's rejoin after a coordinator loss")
	t.Parallel()
	for _, kind := range []string{"dead", "moved"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			c := kafkatest.Start(t)
			c.RequireEmbedded(t)
			kf := c.Kfake()
			const partitions = 2
			topic, group := c.NewTopic(t, partitions), c.NewGroup(t)
			outage := newCoordinatorOutage(t, kf, group, kind)

			acks, watch := watchCommits(t, c, group, topic)
			// A session long enough that the outage, Sarama's retries
			// within it and the rejoin fit in it under -race on a loaded
			// machine: the embedded broker keeps the member's session timer
			// running while the coordinator is away (a real cluster's new
			// coordinator restarts it when it loads the group).
			const session = 20 * time.Second
			sub := newTestSubscriber(t, c, group, func(cfg *safeack.SubscriberConfig) {
				cfg.OverwriteSaramaConfig.Consumer.Group.Session.Timeout = session
				// Sarama's default: the heartbeat loop gives up on a
				// missing coordinator after a few tries.
				cfg.OverwriteSaramaConfig.Metadata.Retry.Max = 3
			})
			handleAll(mustSubscribe(t, sub, topic), acks.ack)

			c.ProduceN(t, topic, partitions, 20, nil)
			acks.waitAllAcked(t, c, topic, 20*time.Second)
			var memberID string
			kafkatest.WaitFor(t, 20*time.Second, "one member owning every partition", func() bool {
				gi := kf.GroupInfo(group)
				if gi == nil || gi.State != "Stable" || len(gi.Members) != 1 || gi.Members[0].NumAssigned() != partitions {
					return false
				}
				memberID = gi.Members[0].MemberID
				return true
			})
			t.Logf("member %s", memberID)

			// The coordinator goes away: the session ends (heartbeats fail)
			// and rejoining fails, several times.
			outage.down.Store(true)
			down := time.Now()
			// Consume failed (Sarama gave up rejoining: Ready reports the
			// error), and the subscription tried again.
			kafkatest.WaitFor(t, 20*time.Second, "Consume to fail", func() bool {
				err := sub.Ready()
				return err != nil && strings.Contains(err.Error(), "reconnecting after")
			})
			t.Logf("during the outage: %v", sub.Ready())
			refused := outage.refused.Load()
			kafkatest.WaitFor(t, 20*time.Second, "2 more JoinGroups refused", func() bool { return outage.refused.Load() >= refused+2 })
			c.ProduceN(t, topic, partitions, 20, nil)

			// Back well within a session timeout: the member rejoins
			// under its id, and the group does not wait for an orphan.
			outage.down.Store(false)
			back := time.Now()
			t.Logf("the coordinator was away for %v", back.Sub(down).Round(time.Millisecond))
			kafkatest.WaitFor(t, 2*session, "the member to consume again, alone in a stable group", func() bool {
				gi := kf.GroupInfo(group)
				return sub.Ready() == nil && len(ownedPartitions(sub, topic)) == partitions &&
					gi != nil && gi.State == "Stable" && len(gi.Members) == 1 && gi.NumAssigned() == partitions
			})
			recovered := time.Since(back)
			gi := kf.GroupInfo(group)
			require.Len(t, gi.Members, 1, "members after the outage")
			assert.Equal(t, memberID, gi.Members[0].MemberID, "member id after the outage")
			for i, id := range outage.joins() {
				if i > 0 { // the first JoinGroup of a new member has no id (KIP-394)
					assert.Equal(t, memberID, id, "JoinGroup %d", i)
				}
			}
			t.Logf("%d JoinGroups refused; the member consumed every partition again %v after the coordinator came back (session timeout %v)",
				outage.refused.Load(), recovered.Round(time.Millisecond), session)
			acks.waitAllAcked(t, c, topic, 20*time.Second)
			require.NoError(t, sub.Ready())

			// Close during an outage: the retries stop at once.
			outage.down.Store(true)
			refused = outage.refused.Load()
			kafkatest.WaitFor(t, 20*time.Second, "2 more JoinGroups refused", func() bool { return outage.refused.Load() >= refused+2 })
			start := time.Now()
			require.NoError(t, sub.Close())
			took := time.Since(start)
			t.Logf("Close during the outage took %v", took.Round(time.Millisecond))
			assert.Less(t, took, 5*time.Second, "Close during an outage")
			outage.down.Store(false)

			require.Positive(t, watch.check(t), "no commit observed")
		})
	}
}
