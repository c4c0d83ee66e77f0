package consume

import (
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/safeack/safeack/internal/partition"
)

// leaderLoss follows whether the leaders of a subscription's running
// claims (without a consumer group: its running partitions) answer for
// them. When the leader of a partition goes away while it is consumed,
// Sarama's partition consumer waits for a new one by itself, asking again
// every Consumer.Retry.Backoff for as long as it takes: it reports an
// error at each try while the cluster names no leader, and nothing at
// all while the leader it names refuses the fetch. The claim runs on, and
// Stats kept the last high-water mark listed: a lag of 0 while records
// waited, and nothing said that the partition was not consumed. The
// listing of high-water marks (WorkerSet.setHighWaterMarks, once per
// commit interval) asks each running partition's leader: a partition
// whose leader has not answered for claimOverdueAfter is reported as a
// claim that cannot start is (an Error log, Subscriber.Unclaimed with
// Claimed set), until its leader answers again or the claim ends.
type leaderLoss struct {
	sub *subscription
	// overdueAfter is claimOverdueAfter of the subscription's config.
	overdueAfter time.Duration

	mu    sync.Mutex
	parts map[*partition.Worker]*leaderState // the running claims'
}

// leaderState is what a leaderLoss knows of one running claim.
type leaderState struct {
	assignedAt time.Time
	// since is the first listing in a row that its leader did not answer;
	// zero when the last one did.
	since    time.Time
	err      error // the last listing's
	reported bool  // logged, and listed by Subscriber.Unclaimed
}

func newLeaderLoss(sub *subscription) *leaderLoss {
	return &leaderLoss{sub: sub, overdueAfter: claimOverdueAfter(sub.cfg.OverwriteSaramaConfig)}
}

// started follows the claim whose worker is w, from now on.
func (l *leaderLoss) started(w *partition.Worker) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.parts == nil {
		l.parts = make(map[*partition.Worker]*leaderState)
	}
	l.parts[w] = &leaderState{assignedAt: time.Now()}
}

// ended stops following w's claim: it is over.
func (l *leaderLoss) ended(w *partition.Worker) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.parts[w]; st != nil && st.reported {
		l.sub.host.RemoveUnclaimed(l.sub, w.Partition())
	}
	delete(l.parts, w)
}

// listed takes the result of a listing of the high-water marks of workers:
// failed holds the partitions whose leader did not answer, and why.
func (l *leaderLoss) listed(workers []*partition.Worker, failed map[int32]error) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range workers {
		st := l.parts[w]
		if st == nil {
			continue // ended since the listing started
		}
		p := w.Partition()
		err, lost := failed[p]
		if !lost {
			if st.reported {
				l.sub.host.RemoveUnclaimed(l.sub, p)
				l.sub.logger.Info("The partition's leader answers again; it is consumed again",
					l.sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "waited": now.Sub(st.since).Round(time.Millisecond).String()}))
			}
			st.since, st.err, st.reported = time.Time{}, nil, false
			continue
		}
		if st.since.IsZero() {
			st.since = now
		}
		st.err = err
		if st.reported || now.Sub(st.since) < l.overdueAfter {
			continue
		}
		st.reported = true
		l.sub.host.AddUnclaimed(l.sub, Unclaimed{
			TopicPartition: TopicPartition{Topic: l.sub.topic, Partition: p},
			AssignedAt:     st.assignedAt,
			Since:          st.since,
			Claimed:        true,
			Err:            err,
		})
		l.sub.logger.Error("A partition consumed by this member lost its leader: nothing more is fetched from it; waiting for its leader", err,
			l.sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "waited": now.Sub(st.since).Round(time.Millisecond).String()}))
	}
}
