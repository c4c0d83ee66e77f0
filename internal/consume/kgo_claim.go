package consume

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
)

// kgoClaim is one assigned partition of a consumer-protocol member, as the
// engine-neutral claim takes it (groupClaim): the poll loop pushes its
// records, and a goroutine of its own feeds them to the claim's worker, so
// that a worker that does not take records (at its bound, paused) never
// holds the other partitions' records up. What a paused partition had
// fetched waits here; kgo fetches nothing more for it until it resumes.
type kgoClaim struct {
	topic     string
	partition int32
	hwm       atomic.Int64

	out  chan *sarama.ConsumerMessage // the worker's feed; closed when the claim stops
	done chan struct{}                // closed when the claim's run returned

	// validated is the claim's validated leader epoch (nil: none is
	// watched): a record of a newer epoch waits until the epoch watch
	// checked it, as Sarama's records wait for its metadata to name the
	// new leader.
	validated atomic.Pointer[func() int32]

	// divergedMu guards onDiverged, the claim's way to report a
	// divergence once its worker runs (see feed.diverging), and pending,
	// one reported before (-1: none).
	divergedMu sync.Mutex
	onDiverged func(at int64)
	pending    int64

	mu      sync.Mutex
	queue   []kgoRecord
	wake    chan struct{} // capacity 1: the queue grew
	stopped chan struct{}
	stopOne sync.Once
}

var _ groupClaim = (*kgoClaim)(nil)

// kgoRecord is a fetched record and the leader epoch of its batch.
type kgoRecord struct {
	msg   *sarama.ConsumerMessage
	epoch int32
}

// watching is the feed's watching hook (see feed.watching).
func (c *kgoClaim) watching(validated func() int32) { c.validated.Store(&validated) }

// newKgoClaim starts the claim's feed. buffered is the capacity of the
// worker's channel (Consumer.ChannelBufferSize, as Sarama's claims have):
// an unbuffered one hands every record from the feed's goroutine to the
// worker's, a scheduler round trip each.
func newKgoClaim(topic string, p int32, buffered int) *kgoClaim {
	c := &kgoClaim{
		topic: topic, partition: p,
		out:     make(chan *sarama.ConsumerMessage, buffered),
		done:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
		pending: -1,
	}
	go c.feed()
	return c
}

func (c *kgoClaim) Topic() string              { return c.topic }
func (c *kgoClaim) Partition() int32           { return c.partition }
func (c *kgoClaim) HighWaterMarkOffset() int64 { return c.hwm.Load() }

// diverging is the feed's diverging hook: a divergence reported before
// the worker ran is passed on now.
func (c *kgoClaim) diverging(diverged func(at int64)) {
	c.divergedMu.Lock()
	c.onDiverged = diverged
	at := c.pending
	c.divergedMu.Unlock()
	if at >= 0 {
		diverged(at)
	}
}

// diverged tells the claim that franz-go found its partition's log
// diverged at at and fetches from there again (an ErrDataLoss): the claim
// ends, holding its marks there (see member.diverged), and starts again
// from the group's commit; what it queued is dropped with it.
func (c *kgoClaim) diverged(at int64) {
	c.divergedMu.Lock()
	f := c.onDiverged
	if f == nil && (c.pending < 0 || at < c.pending) {
		c.pending = at
	}
	c.divergedMu.Unlock()
	if f != nil {
		f(at)
	}
}

// push queues records for the worker. It never blocks.
func (c *kgoClaim) push(msgs []kgoRecord) {
	c.mu.Lock()
	c.queue = append(c.queue, msgs...)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// stop ends the feed: the worker's channel closes, and the records still
// queued are left (unhanded, so uncommitted: the next owner fetches them).
func (c *kgoClaim) stop() { c.stopOne.Do(func() { close(c.stopped) }) }

func (c *kgoClaim) feed() {
	defer close(c.out)
	for {
		c.mu.Lock()
		batch := c.queue
		c.queue = nil
		c.mu.Unlock()
		for _, r := range batch {
			if !c.epochChecked(r.epoch) {
				return
			}
			select {
			case c.out <- r.msg:
			case <-c.stopped:
				return
			}
		}
		select {
		case <-c.wake:
		case <-c.stopped:
			return
		}
	}
}

// epochChecked waits until the epoch watch validated epoch (at once when
// none watches). It reports false when the claim stopped first.
func (c *kgoClaim) epochChecked(epoch int32) bool {
	for {
		v := c.validated.Load()
		if v == nil || (*v)() >= epoch {
			return true
		}
		select {
		case <-c.stopped:
			return false
		case <-time.After(epochWatchEvery):
		}
	}
}
