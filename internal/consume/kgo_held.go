package consume

import (
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
)

// kgoHeld holds back the claims of the partitions a consumer-protocol
// member was assigned whose leaders did not answer (the cluster names none,
// or the one it names refuses): franz-go would fetch them on its own, and
// their claims would start at once, in Stats, though nothing of theirs is
// fetched. As the classic engine's claim watch does, their fetching is
// paused and their claims wait: the watch asks their leaders every
// claimCheckEvery, starts a claim once its leader answers, and reports a
// claim that has not started within claimOverdueAfter (an Error log and
// Subscriber.Unclaimed), until it starts or its partition is revoked.
type kgoHeld struct {
	g *kgoGroup
	// overdueAfter is claimOverdueAfter of the subscription's config: the
	// classic engine's bound.
	overdueAfter time.Duration

	mu       sync.Mutex
	parts    map[int32]*heldClaim
	watching bool // run's goroutine runs
}

// heldClaim is what a kgoHeld knows of one held partition.
type heldClaim struct {
	assignedAt time.Time
	err        error // why it is not consumed, as last seen
	reported   bool  // logged, and listed by Subscriber.Unclaimed
}

// hold holds back the claims of parts, whose leaders did not answer with
// errs. Their fetching is paused by the caller.
func (h *kgoHeld) hold(parts []int32, errs map[int32]error) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parts == nil {
		h.parts = make(map[int32]*heldClaim)
	}
	for _, p := range parts {
		h.parts[p] = &heldClaim{assignedAt: now, err: errs[p]}
		h.g.sub.logger.Info("The partition's leader did not answer; its claim waits until it does",
			h.g.sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "err": errString(errs[p])}))
	}
	if !h.watching && len(h.parts) > 0 {
		h.watching = true
		go h.run()
	}
}

// forget stops holding parts (revoked or lost; nil: every partition, the
// subscription stops); those reported leave Subscriber.Unclaimed.
func (h *kgoHeld) forget(parts []int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p, st := range h.parts {
		if parts != nil && !slices.Contains(parts, p) {
			continue
		}
		if st.reported {
			h.g.sub.host.RemoveUnclaimed(h.g.sub, p)
		}
		delete(h.parts, p)
	}
}

// run checks the held claims every claimCheckEvery while there are any,
// until the session ends.
func (h *kgoHeld) run() {
	t := time.NewTicker(claimCheckEvery)
	defer t.Stop()
	ctx := h.g.sess.Context()
	for {
		select {
		case <-ctx.Done():
			h.mu.Lock()
			h.watching = false
			h.mu.Unlock()
			return
		case <-t.C:
		}
		if !h.check() {
			return
		}
	}
}

// check asks the held partitions' leaders (with fresh metadata), starts
// the claims of those that answered and reports the overdue ones. It
// returns false, and the watch ends, once nothing is held.
func (h *kgoHeld) check() bool {
	h.mu.Lock()
	held := make([]int32, 0, len(h.parts))
	for p := range h.parts {
		held = append(held, p)
	}
	if len(held) == 0 {
		h.watching = false
		h.mu.Unlock()
		return false
	}
	h.mu.Unlock()
	slices.Sort(held)
	_, failed := h.g.reads.listOffsetsOnce(held, sarama.OffsetNewest, true)
	now := time.Now()
	var answered []int32
	h.mu.Lock()
	for _, p := range held {
		st := h.parts[p]
		if st == nil {
			continue // revoked meanwhile
		}
		err, refused := failed[p]
		if !refused {
			answered = append(answered, p)
			if st.reported {
				h.g.sub.host.RemoveUnclaimed(h.g.sub, p)
			}
			delete(h.parts, p)
			h.g.sub.logger.Info("The partition's leader answers; its claim starts",
				h.g.sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "waited": now.Sub(st.assignedAt).Round(time.Millisecond).String()}))
			continue
		}
		st.err = err
		if st.reported || now.Sub(st.assignedAt) < h.overdueAfter {
			continue
		}
		st.reported = true
		h.g.sub.host.AddUnclaimed(h.g.sub, Unclaimed{
			TopicPartition: TopicPartition{Topic: h.g.sub.topic, Partition: p},
			AssignedAt:     st.assignedAt,
			Since:          st.assignedAt,
			Err:            err,
		})
		h.g.sub.logger.Error("A partition assigned to this member is not consumed: its claim cannot start; waiting for its leader", err,
			h.g.sub.logFields.Add(watermill.LogFields{"kafka_partition": p, "waited": now.Sub(st.assignedAt).Round(time.Millisecond).String()}))
	}
	h.mu.Unlock()
	if len(answered) > 0 {
		h.g.startClaims(answered, true)
	}
	return true
}

// errString is err's text, "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
