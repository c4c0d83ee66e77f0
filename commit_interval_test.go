package safeack_test

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/safeack/safeack"
	"github.com/safeack/safeack/internal/kafkatest"
)

// TestCommitIntervalResolved: a CommitInterval that is set is the commit
// period whether Sarama's auto-commit is on or off; left zero, the period
// is Sarama's auto-commit interval when auto-commit is on (a config moved
// from watermill-kafka keeps its period), else 1 s. A set CommitInterval
// that overrides an auto-commit interval the caller chose says so at Info.
func TestCommitIntervalResolved(t *testing.T) {
	t.Parallel()
	saramaDefault := sarama.NewConfig().Consumer.Offsets.AutoCommit.Interval
	for _, tc := range []struct {
		name         string
		autoCommit   bool
		autoInterval time.Duration // 0: Sarama's default
		set          time.Duration
		want         time.Duration
		logsUnused   bool
	}{
		{"defaults", true, 0, 0, saramaDefault, false},
		{"auto-commit interval, CommitInterval unset", true, 300 * time.Millisecond, 0, 300 * time.Millisecond, false},
		{"CommitInterval set, auto-commit on", true, 0, 200 * time.Millisecond, 200 * time.Millisecond, false},
		{"CommitInterval set over a chosen auto-commit interval", true, 5 * time.Second, 200 * time.Millisecond, 200 * time.Millisecond, true},
		{"auto-commit off, CommitInterval unset", false, 0, 0, safeack.DefaultCommitInterval, false},
		{"auto-commit off, CommitInterval set", false, 5 * time.Second, 200 * time.Millisecond, 200 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := safeack.DefaultSaramaSubscriberConfig()
			sc.Consumer.Offsets.AutoCommit.Enable = tc.autoCommit
			if tc.autoInterval != 0 {
				sc.Consumer.Offsets.AutoCommit.Interval = tc.autoInterval
			}
			logs := watermill.NewCaptureLogger()
			sub, err := safeack.NewSubscriber(safeack.SubscriberConfig{
				Brokers: []string{"127.0.0.1:9092"}, ConsumerGroup: "g",
				OverwriteSaramaConfig: sc, CommitInterval: tc.set,
			}, logs)
			require.NoError(t, err)
			require.Equal(t, tc.want, sub.CommitInterval())
			require.Equal(t, tc.autoCommit, sc.Consumer.Offsets.AutoCommit.Enable, "the caller's Sarama config was changed")
			unused := false
			for _, m := range logs.Captured()[watermill.InfoLogLevel] {
				unused = unused || m.Fields["unused_auto_commit_interval"] != nil
			}
			require.Equal(t, tc.logsUnused, unused, "Info line naming the unused auto-commit interval")
		})
	}
}

// TestCommitIntervalSetsCommitPeriod: with Sarama's auto-commit on at its
// default 1 s (as router_example and most configs run), a CommitInterval of
// 200 ms makes the commits at the broker 200 ms apart; left unset, they are
// 1 s apart. Each subscriber holds its partition's first record unacked, so
// no commit is an early one (those come when every received record is
// complete), and acks the records produced behind it, so the completed tail
// changes and every tick has something to commit. The OffsetCommit requests
// are observed at the broker.
func TestCommitIntervalSetsCommitPeriod(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Embedded()) // the commits' times are read at the broker
	commits := c.ObserveCommits(t)
	const window = 4 * time.Second
	type member struct {
		topic, group string
		held         *message.Message
	}
	members := map[time.Duration]*member{} // by CommitInterval set
	for _, set := range []time.Duration{0, 200 * time.Millisecond} {
		m := &member{topic: c.NewTopic(t, 1), group: c.NewGroup(t)}
		members[set] = m
		sub := newTestSubscriber(t, c, m.group, func(cfg *safeack.SubscriberConfig) {
			cfg.OverwriteSaramaConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
			cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Enable = true
			cfg.OverwriteSaramaConfig.Consumer.Offsets.AutoCommit.Interval = sarama.NewConfig().Consumer.Offsets.AutoCommit.Interval
			cfg.CommitInterval = set
			cfg.Ordering = safeack.Unordered
		})
		require.Equal(t, cmp.Or(set, time.Second), sub.CommitInterval())
		head := make(chan *message.Message, 1)
		handleAll(mustSubscribe(t, sub, m.topic), func(msg *message.Message) {
			if off, _ := safeack.MessagePartitionOffsetFromCtx(msg.Context()); off == 0 {
				head <- msg // held until the window ends
				return
			}
			msg.Ack()
		})
		c.Produce(t, m.topic, kafkatest.Record{Value: []byte("head")})
		select {
		case m.held = <-head:
		case <-time.After(30 * time.Second):
			t.Fatalf("CommitInterval %v: the head record was not delivered within 30 s", set)
		}
	}
	start := time.Now()
	for i := 0; time.Since(start) < window; i++ {
		for _, m := range members {
			c.Produce(t, m.topic, kafkatest.Record{Value: fmt.Appendf(nil, "r%d", i)})
		}
		time.Sleep(20 * time.Millisecond) // a steady trickle of records, not a wait for a condition
	}
	end := time.Now()
	gaps := func(group string) []time.Duration {
		var at []time.Time
		for _, oc := range commits.Commits() {
			if oc.Group == group && oc.At.After(start) && oc.At.Before(end) {
				at = append(at, oc.At)
			}
		}
		var g []time.Duration
		for i := 1; i < len(at); i++ {
			g = append(g, at[i].Sub(at[i-1]))
		}
		slices.Sort(g)
		return g
	}
	median := func(g []time.Duration) time.Duration {
		if len(g) == 0 {
			return 0
		}
		return g[len(g)/2]
	}
	for _, m := range members {
		m.held.Ack()
	}
	fast, slow := gaps(members[200*time.Millisecond].group), gaps(members[0].group)
	t.Logf("over %v: CommitInterval 200ms: %d gaps between commits, median %v; unset (Sarama's 1 s): %d gaps, median %v",
		end.Sub(start).Round(time.Millisecond), len(fast), median(fast), len(slow), median(slow))
	// Generous bounds: about 20 and 4 commits are expected.
	require.GreaterOrEqual(t, len(fast), 8, "CommitInterval 200ms: too few commits")
	require.LessOrEqual(t, len(slow), 6, "CommitInterval unset: more commits than a 1 s period gives")
	require.Less(t, median(fast), 600*time.Millisecond, "CommitInterval 200ms: median gap between commits")
	require.Greater(t, median(slow), 700*time.Millisecond, "CommitInterval unset: median gap between commits")
}
