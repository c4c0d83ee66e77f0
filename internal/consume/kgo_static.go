package consume

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/safeack/safeack/internal/ready"
)

// A static member (Consumer.Group.InstanceId) on the consumer protocol:
// fenced when another member took its instance id, and its own leave.

// fence ends the member whose instance id another member took: the
// coordinator answers FENCED_INSTANCE_ID (to a heartbeat naming the id, or
// a commit), or, to the rejoin of a member it dropped, UNRELEASED_INSTANCE_ID
// (franz-go's keepalive heartbeats name no instance id: a dropped member
// is told UNKNOWN_MEMBER_ID and rejoins). On the consumer protocol another
// member can take the id only once this one's session expired (a member
// stalled, cut off): while this one is alive the coordinator refuses the
// other's join. As on the classic protocol the subscription stops for
// good, with sentinel.ErrInstanceFenced: a rejoin would only be refused
// while the other member holds the id.
func (g *kgoGroup) fence() {
	g.fenceOnce.Do(func() { close(g.fencedCh) })
}

// kgoFenceHook tells the member of an error that ended kgo's group
// session: FENCED_INSTANCE_ID fences it (see kgoGroup.fence).
type kgoFenceHook struct{ g *kgoGroup }

func (h kgoFenceHook) OnGroupManageError(err error) {
	switch {
	case errors.Is(err, kerr.FencedInstanceID):
		h.g.fence()
	case errors.Is(err, kerr.UnreleasedInstanceID) && h.g.joined.Load():
		h.g.fence()
	case errors.Is(err, kerr.UnreleasedInstanceID):
		// A member that never joined: another one holds the instance id
		// (a copy started beside the running one, or the restart of a
		// deploy before the old one left). franz-go goes on trying; the
		// member joins once the other leaves.
		id := h.g.sub.cfg.OverwriteSaramaConfig.Consumer.Group.InstanceId
		err = fmt.Errorf("another live member of consumer group %q holds Consumer.Group.InstanceId %q; joining once it leaves: %w",
			h.g.sub.cfg.ConsumerGroup, id, err)
		h.g.sub.logger.Error("Cannot join the consumer group", err, h.g.sub.logFields.Add(watermill.LogFields{"instance_id": id}))
		h.g.sub.setPhase(ready.Joining, err)
	}
}

var _ kgo.HookGroupManageError = kgoFenceHook{}

// leaveStatic sends a static member's leave (member epoch -2, with its
// instance id) once its client closed: franz-go's own leave names no
// instance id, which Kafka refuses (INVALID_REQUEST), and the instance id
// would stay taken until the member's session expired, refusing the
// member's restart (UNRELEASED_INSTANCE_ID).
func (g *kgoGroup) leaveStatic(client *kgo.Client, memberID, instanceID string) {
	if memberID == "" {
		return
	}
	ctx, cancel := g.sub.halt.within(CloseGrace)
	defer cancel()
	err := func() error {
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Group, req.MemberID, req.MemberEpoch, req.InstanceID = g.sub.cfg.ConsumerGroup, memberID, -2, &instanceID
		resp, err := req.RequestWith(ctx, client)
		if err != nil {
			return err
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownMemberID) {
			return err
		}
		return nil
	}()
	if err != nil {
		g.sub.logger.Info("Cannot leave the consumer group; the coordinator keeps the instance id until the member's session expires",
			g.sub.logFields.Add(watermill.LogFields{"err": err.Error(), "instance_id": instanceID}))
	}
}
