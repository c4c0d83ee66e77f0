package safeack_test

import (
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestStartWithoutCommitLogged: where a partition on which the group has
// no commit starts, and why (Consumer.Offsets.Initial), is logged at Info
// once per partition, so that a newcomer whose records were produced
// before the first run sees at once why they are not handled; a member
// that finds the group's commits logs nothing of the kind.
func TestStartWithoutCommitLogged(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	for _, tc := range []struct {
		name    string
		initial int64
		says    string
		start   int64 // of every partition: 2 records were produced before
	}{
		{"newest", sarama.OffsetNewest, "Consumer.Offsets.Initial = OffsetNewest", 2},
		{"oldest", sarama.OffsetOldest, "Consumer.Offsets.Initial = OffsetOldest", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const partitions = 2
			topic, group := c.NewTopic(t, partitions), c.NewGroup(t)
			c.ProduceN(t, topic, partitions, 2*partitions, nil)
			startLines := func(logs *watermill.CaptureLoggerAdapter) map[int32][]int64 {
				out := map[int32][]int64{}
				for _, m := range logs.Captured()[watermill.InfoLogLevel] {
					if strings.HasPrefix(m.Msg, "The group has no committed offset for this partition") && strings.Contains(m.Msg, tc.says) {
						p, _ := m.Fields["kafka_partition"].(int32)
						out[p] = append(out[p], m.Fields["start_offset"].(int64))
					}
				}
				return out
			}
			member := func(logs *watermill.CaptureLoggerAdapter) {
				sub := newLoggedSubscriber(t, c, group, logs, func(cfg *safeack.SubscriberConfig) {
					cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = tc.initial
				})
				countAndAck(mustSubscribe(t, sub, topic))
				kafkatest.WaitFor(t, mwWait, "every partition's start committed", func() bool {
					for p := range int32(partitions) {
						if co, ok := c.CommittedOffsets(t, group, topic)[p]; !ok || co.Offset < 0 {
							return false
						}
					}
					return true
				})
				require.NoError(t, sub.Close())
			}
			first := watermill.NewCaptureLogger()
			member(first)
			require.Equal(t, map[int32][]int64{0: {tc.start}, 1: {tc.start}}, startLines(first),
				"Info lines per partition (start offsets) of the group's first member")
			second := watermill.NewCaptureLogger()
			member(second)
			require.Empty(t, startLines(second), "a member that finds the group's commits")
		})
	}
}
