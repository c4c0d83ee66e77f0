package safeack_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// protocolLoggedSubscriber is a subscriber of group on protocol p,
// logging to logs.
func protocolLoggedSubscriber(t *testing.T, c *kafkatest.Cluster, group string, p safeack.GroupProtocol, logs errorLog) *safeack.Subscriber {
	t.Helper()
	sub, err := safeack.NewSubscriber(protocolConfig(c, group, p, nil), logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// Unclaimed reports the same on both group protocols. A partition whose
// leader is away as the member is assigned it (the cluster names none, or
// the one it names refuses to list or fetch it): the healthy partition is
// consumed, the other is listed (not Claimed, with why, not in Stats,
// safeack_unclaimed_seconds) and logged as an Error within the claim
// bound, and consumed once its leader answers, which clears the report.
// Before, on the consumer protocol franz-go fetched the partition on its
// own and its claim started at once: Unclaimed listed nothing, and Stats
// showed the partition as consumed.
func TestUnclaimedAtAssignmentBothProtocols(t *testing.T) {
	t.Parallel()
	forProtocols(t, func(t *testing.T, p safeack.GroupProtocol) {
		for _, f := range leaderFaults {
			t.Run(f.name, func(t *testing.T) {
				t.Parallel()
				c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
				acks, watch := watchCommits(t, c, group, topic)
				c.ProduceN(t, topic, 2, 10, nil)
				restore := f.apply(t, c, topic, 1)

				logs := newErrorLog()
				sub := protocolLoggedSubscriber(t, c, group, p, logs)
				handleAll(mustSubscribe(t, sub, topic), acks.ack)
				kafkatest.WaitFor(t, unclaimedDeadline, "the healthy partition's records to be acked", func() bool {
					return len(acks.missing(c, topic)) == 5 // partition 1's
				})
				waitUnclaimedReported(t, sub, logs, topic, 1)
				require.False(t, sub.Unclaimed()[0].Claimed, "its claim has not started")

				restore()
				c.Produce(t, topic, kafkatest.Record{Partition: 1}, kafkatest.Record{Partition: 0})
				acks.waitAllAcked(t, c, topic, unclaimedDeadline)
				kafkatest.WaitFor(t, unclaimedDeadline, "the report to clear", func() bool {
					return len(sub.Unclaimed()) == 0 && len(unclaimedSeries(t, sub)) == 0
				})
				_, owned := statsOf(sub, topic, 1)
				require.True(t, owned, "the partition is in Stats once consumed")
				watch.check(t)
			})
		}
	})
}

// A partition loses its leader while its claim consumes it, with one of
// its records in a handler, on both group protocols: the member consumes
// its other partition on, commits the ack of the record in the handler,
// lists the partition as Claimed (in Stats, with why) and logs it, and
// consumes it again once its leader answers, which clears the report.
func TestUnclaimedLeaderLostBothProtocols(t *testing.T) {
	t.Parallel()
	forProtocols(t, func(t *testing.T, p safeack.GroupProtocol) {
		for _, f := range leaderFaults {
			t.Run(f.name, func(t *testing.T) {
				t.Parallel()
				c, topic, group := kafkatest.StartTopic(t, 2, kafkatest.Embedded())
				acks, watch := watchCommits(t, c, group, topic)
				c.ProduceN(t, topic, 2, 4, nil) // offsets 0 and 1 of each

				logs := newErrorLog()
				sub := protocolLoggedSubscriber(t, c, group, p, logs)
				release := make(chan struct{})
				handleAll(mustSubscribe(t, sub, topic), func(m *message.Message) {
					if k, _ := msgPO(m); k == (po{1, 2}) {
						<-release
					}
					acks.ack(m)
				})
				c.Produce(t, topic, kafkatest.Record{Partition: 1})
				kafkatest.WaitFor(t, unclaimedDeadline, "record 1@2 to be in its handler, the others acked", func() bool {
					ps, ok := statsOf(sub, topic, 1)
					return ok && ps.InFlight == 1 && len(acks.missing(c, topic)) == 1
				})

				restore := f.apply(t, c, topic, 1)
				c.Produce(t, topic, kafkatest.Record{Partition: 0})
				close(release)
				kafkatest.WaitFor(t, unclaimedDeadline, "every record to be acked", func() bool {
					return len(acks.missing(c, topic)) == 0
				})
				watch.waitCommitted(t, map[int32]int64{0: 3, 1: 3}, unclaimedDeadline)
				waitLeaderLostReported(t, sub, logs, topic, 1)

				restore()
				c.Produce(t, topic, kafkatest.Record{Partition: 1}, kafkatest.Record{Partition: 0})
				acks.waitAllAcked(t, c, topic, unclaimedDeadline)
				kafkatest.WaitFor(t, unclaimedDeadline, "the report to clear", func() bool {
					return len(sub.Unclaimed()) == 0 && len(unclaimedSeries(t, sub)) == 0
				})
				watch.check(t)
			})
		}
	})
}
