package safeack

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/safeack/safeack/internal/delivery"
)

// Defaults of BatchConfig.
const (
	// DefaultBatchMaxSize: past about a hundred rows, one more row costs a
	// database insert far more than its share of the transaction's commit,
	// so larger batches gain little and hold more records unfinished.
	DefaultBatchMaxSize = 100
	// DefaultBatchMaxWait is what a lone message waits for company: well
	// below the default commit interval, so a quiet topic's end lag grows
	// by a tenth of a second at most.
	DefaultBatchMaxWait = 100 * time.Millisecond
	// DefaultBatchMaxConcurrent: one batch runs while the next one
	// collects. A database takes one writer at a time (SQLite) or has its
	// concurrent transactions contend on the same tables and indexes; a
	// second batch at once helps only where writes scale with connections.
	DefaultBatchMaxConcurrent = 1
)

// BatchConfig configures a Batcher. A zero field takes its default.
type BatchConfig struct {
	// MaxSize is the most messages a batch holds: a batch is run as soon
	// as it holds MaxSize. Default DefaultBatchMaxSize.
	MaxSize int
	// MaxWait is the longest the first message of a batch waits for
	// others before the batch runs. Default DefaultBatchMaxWait.
	MaxWait time.Duration
	// MaxConcurrent is how many batches may run at once; a batch ready
	// while MaxConcurrent run waits for one of them to return. Default
	// DefaultBatchMaxConcurrent.
	MaxConcurrent int
}

func (c BatchConfig) withDefaults() BatchConfig {
	if c.MaxSize == 0 {
		c.MaxSize = DefaultBatchMaxSize
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultBatchMaxWait
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultBatchMaxConcurrent
	}
	return c
}

// Validate reports the first invalid field of c, after defaults are
// applied. Each error wraps ErrInvalidConfig and names the field.
func (c BatchConfig) Validate() error {
	c = c.withDefaults()
	if c.MaxSize < 0 {
		return fieldError("MaxSize", "negative size %d", c.MaxSize)
	}
	if c.MaxWait < 0 {
		return fieldError("MaxWait", "negative duration %v", c.MaxWait)
	}
	if c.MaxConcurrent < 0 {
		return fieldError("MaxConcurrent", "negative count %d", c.MaxConcurrent)
	}
	return nil
}

// BatchFunc handles a batch of messages at once, typically writing them in
// one database transaction. It returns nil when all of them are done, a
// *BatchError (possibly wrapped) naming the messages that failed, or any
// other error to fail them all. ctx ends once no message of the batch is
// waiting for the result any more (each message's context ended: the
// subscriber gave up on them at Close or revocation); it carries no
// values of the messages' contexts.
type BatchFunc func(ctx context.Context, msgs []*message.Message) error

// BatchError is the error a BatchFunc returns when some of its messages
// failed and the others are done: each message named with Fail has its
// handler return the error given for it, so that the router's middleware
// (Retry, PoisonQueue) and the Nack treat it alone; the batch's other
// messages are acked. The zero value is ready to use; return a pointer to
// it. A BatchError naming no message fails nothing. Messages not in the
// batch are ignored.
type BatchError struct {
	failed map[*message.Message]error
	first  *message.Message
}

// Fail names msg as failed with err (a generic error when err is nil); a
// later call for the same message replaces its error. It returns e, for
// chaining.
func (e *BatchError) Fail(msg *message.Message, err error) *BatchError {
	if err == nil {
		err = errBatchMessageFailed
	}
	if e.failed == nil {
		e.failed = make(map[*message.Message]error)
	}
	if len(e.failed) == 0 {
		e.first = msg
	}
	e.failed[msg] = err
	return e
}

// Len returns how many messages e names.
func (e *BatchError) Len() int { return len(e.failed) }

// Err returns the error msg failed with, or nil when e does not name it.
func (e *BatchError) Err(msg *message.Message) error { return e.failed[msg] }

// Error names how many messages failed, and one of them with its error.
func (e *BatchError) Error() string {
	if len(e.failed) == 0 {
		return "safeack: batch error naming no message"
	}
	return fmt.Sprintf("safeack: %d message(s) of the batch failed, e.g. %s: %v", len(e.failed), e.first.UUID, e.failed[e.first])
}

var (
	errBatchMessageFailed = errors.New("safeack: message failed in its batch")
	// errBatchContextEnded is the result of a message whose context ended
	// before its batch ran or returned.
	errBatchContextEnded = errors.New("safeack: the message's context ended before its batch completed")
)

// BatchStats are a Batcher's counters since it was made.
type BatchStats struct {
	// Batches is how many batches the function was called with, and
	// Messages how many messages they held in all.
	Batches, Messages int64
	// LastSize is the size of the last batch started; MaxSeen the largest
	// so far.
	LastSize, MaxSeen int
	// Why batches were run: they held MaxSize (Full); their first message
	// waited MaxWait (Waited); they held every message their
	// subscription could hand out, so that no other could join before a
	// batch returned (Bounded, see Batcher); a message's assignment ended
	// (Ending).
	Full, Waited, Bounded, Ending int64
	// Failed counts messages the batch function failed (a *BatchError
	// names them, or it returned another error or panicked), Panics the
	// calls that panicked.
	Failed, Panics int64
	// Abandoned counts batches whose messages' contexts all ended before
	// the function returned: their run slot was freed (see Batcher).
	Abandoned int64
	// Skipped counts messages whose assignment had ended before they
	// joined a batch (nacked without redelivery, as SkipRevoked does),
	// and Withdrawn ones whose context ended while their batch collected.
	Skipped, Withdrawn int64
	// Collecting is the number of messages in the batch being collected,
	// Waiting the batches ready and waiting for a run slot, and Running
	// the batches running now.
	Collecting, Waiting, Running int
}

// Batcher turns a router handler's messages into batches for one
// function. Each message's handler adds the message to the batch being
// collected and blocks until that batch has run, then returns the
// message's own result: nil (the router acks it) or its error (the router
// nacks it, after the middleware's retries). So a message is acked only
// once the function returned, and the committed offset never passes a
// record the batch has not written. Middleware stays per message: a
// failed message is retried alone and joins a later batch, and
// PoisonQueue dead-letters it alone.
//
// A batch runs when it holds MaxSize messages, when its first message has
// waited MaxWait, when it holds every message its subscription can hand
// out (MaxInFlight, less the messages of batches waiting or running: no
// other message could join before one of them returns), or at once when
// a message's assignment ends (a revocation, or Close), so that it runs
// within the drain's DrainTimeout. A waiting message holds an in-flight
// slot: MaxInFlight of at least MaxSize x (MaxConcurrent+1) lets one
// batch collect in full while others run. Other bounds can keep a batch
// smaller than MaxSize, and it then runs after MaxWait: what a partition
// may hold (MaxPendingPerPartition), and ordering: under OrderByKey a
// record waits for the previous one of its key, so a batch holds at most
// one record per key (per partition for key-less records), and under
// OrderByPartition one per partition.
//
// A message whose assignment had ended before it joined is skipped as
// SkipRevoked skips it (nacked without redelivery; the partition's next
// owner handles it); a message whose context ends while its batch
// collects leaves the batch, and its handler returns the context's
// error; a batch about to start leaves out messages whose context has
// ended, so that nothing is written for a partition the subscriber gave
// up on. A batch function that never returns holds its messages until
// their contexts end (the drain's DrainTimeout): their handlers then
// return the context's error, nothing is acked for them, and the run slot
// is freed. A panic in the function fails every message of the batch with
// an error wrapping ErrHandlerPanicked. Messages of several partitions
// and topics may share a batch (one Batcher's handler may serve several
// router handlers); messages of any subscriber are accepted, bounded only
// by MaxSize and MaxWait.
type Batcher struct {
	cfg BatchConfig
	fn  BatchFunc

	mu         sync.Mutex
	collecting *batch
	waiting    []*batch    // flushed, waiting for a run slot (FIFO)
	running    int         // batches holding a run slot
	held       map[any]int // per hand-out pool: messages of batches waiting or running
	stats      BatchStats
}

// batch is a set of messages run together. Its fields are under
// Batcher.mu; the entries' results are written by the run before done
// closes.
type batch struct {
	entries []*batchEntry
	pools   map[any]int // messages per hand-out pool
	timer   *time.Timer
	flushed bool
	done    chan struct{} // closed when every entry's result is set
	// finished is set when the run slot was given back: by the run, or by
	// the abandonment when every message's context ended first.
	finished bool
}

type batchEntry struct {
	msg       *message.Message
	pool      any // nil for a message of another subscriber
	limit     int // the pool's MaxInFlight
	withdrawn bool
	result    error
}

// NewBatcher validates cfg and returns a Batcher running fn. Invalid
// configuration gives an error wrapping ErrInvalidConfig that names the
// field.
func NewBatcher(cfg BatchConfig, fn BatchFunc) (*Batcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, errors.New("safeack: NewBatcher with a nil batch function")
	}
	return &Batcher{cfg: cfg.withDefaults(), fn: fn, held: make(map[any]int)}, nil
}

// Batch returns a router handler that runs fn on batches of its messages
// (see Batcher), for router.AddConsumerHandler. It panics when cfg is
// invalid or fn is nil; use NewBatcher to get an error instead, and to
// read the batches' Stats.
func Batch(cfg BatchConfig, fn BatchFunc) message.NoPublishHandlerFunc {
	b, err := NewBatcher(cfg, fn)
	if err != nil {
		panic(err)
	}
	return b.Handler()
}

// Handler returns the router handler adding each message to a batch. It
// may serve several router handlers; their messages then share batches.
func (b *Batcher) Handler() message.NoPublishHandlerFunc { return b.handle }

// Stats returns the Batcher's counters.
func (b *Batcher) Stats() BatchStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.stats
	if b.collecting != nil {
		s.Collecting = b.live(b.collecting)
	}
	s.Waiting, s.Running = len(b.waiting), b.running
	return s
}

func (b *Batcher) handle(msg *message.Message) error {
	if skipIfRevoked(msg) {
		b.mu.Lock()
		b.stats.Skipped++
		b.mu.Unlock()
		return nil // nacked already; the router's Ack changes nothing
	}
	ctx := msg.Context()
	e := &batchEntry{msg: msg}
	var ending <-chan struct{}
	if d, ok := delivery.FromContext(ctx); ok {
		if bd, ok := d.(delivery.Batchable); ok {
			ending = bd.Ending()
			e.pool, e.limit = bd.HandOutPool()
		}
	}

	b.mu.Lock()
	bt := b.join(e)
	b.mu.Unlock()

	for {
		select {
		case <-bt.done:
			return e.result
		case <-ending:
			ending = nil
			b.mu.Lock()
			if !bt.flushed {
				b.stats.Ending++
				b.flush(bt)
			}
			b.mu.Unlock()
		case <-ctx.Done():
			select {
			case <-bt.done: // both at once: the batch's result counts
				return e.result
			default:
			}
			b.mu.Lock()
			if !bt.flushed {
				e.withdrawn = true
				b.stats.Withdrawn++
				bt.pools[e.pool]-- // nil pool too: harmless
			}
			b.mu.Unlock()
			return fmt.Errorf("%w: %w", errBatchContextEnded, ctx.Err())
		}
	}
}

// join adds e to the collecting batch, starting one when none collects,
// and runs the batch when that makes it ready.
func (b *Batcher) join(e *batchEntry) *batch {
	bt := b.collecting
	if bt == nil {
		bt = &batch{pools: make(map[any]int), done: make(chan struct{})}
		b.collecting = bt
		bt.timer = time.AfterFunc(b.cfg.MaxWait, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if !bt.flushed {
				b.stats.Waited++
				b.flush(bt)
			}
		})
	}
	bt.entries = append(bt.entries, e)
	bt.pools[e.pool]++
	switch {
	case b.live(bt) >= b.cfg.MaxSize:
		b.stats.Full++
		b.flush(bt)
	case e.pool != nil && bt.pools[e.pool]+b.held[e.pool] >= e.limit:
		b.stats.Bounded++
		b.flush(bt)
	}
	return bt
}

// live is the number of bt's messages not withdrawn.
func (b *Batcher) live(bt *batch) int {
	n := 0
	for _, c := range bt.pools {
		n += c
	}
	return n
}

// flush ends bt's collection and runs it, or queues it for a run slot.
// Called with b.mu held.
func (b *Batcher) flush(bt *batch) {
	bt.flushed = true
	bt.timer.Stop()
	if b.collecting == bt {
		b.collecting = nil
	}
	kept := bt.entries[:0]
	for _, e := range bt.entries {
		if !e.withdrawn {
			kept = append(kept, e)
		}
	}
	bt.entries = kept
	if len(kept) == 0 {
		bt.finished = true
		close(bt.done)
		return
	}
	for p, n := range bt.pools {
		if p != nil {
			b.held[p] += n
		}
	}
	if b.running < b.cfg.MaxConcurrent {
		b.running++
		go b.run(bt)
		return
	}
	b.waiting = append(b.waiting, bt)
}

// release gives bt's run slot back and starts the next waiting batch.
// Called with b.mu held.
func (b *Batcher) release(bt *batch) {
	if bt.finished {
		return
	}
	bt.finished = true
	for p, n := range bt.pools {
		if p == nil {
			continue
		}
		if b.held[p] -= n; b.held[p] <= 0 {
			delete(b.held, p)
		}
	}
	b.running--
	if len(b.waiting) > 0 {
		next := b.waiting[0]
		b.waiting[0] = nil
		b.waiting = b.waiting[1:]
		b.running++
		go b.run(next)
	}
}

// run calls the batch function with bt's messages whose contexts are
// still alive, and sets every entry's result.
func (b *Batcher) run(bt *batch) {
	msgs := make([]*message.Message, 0, len(bt.entries))
	for _, e := range bt.entries {
		if err := e.msg.Context().Err(); err != nil {
			e.result = fmt.Errorf("%w: %w", errBatchContextEnded, err)
			continue
		}
		msgs = append(msgs, e.msg)
	}
	if len(msgs) > 0 {
		b.mu.Lock()
		b.stats.Batches++
		b.stats.Messages += int64(len(msgs))
		b.stats.LastSize = len(msgs)
		b.stats.MaxSeen = max(b.stats.MaxSeen, len(msgs))
		b.mu.Unlock()
	}

	var err error
	panicked := false
	if len(msgs) > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		stop := b.abandonWhenGone(bt, msgs, cancel)
		err, panicked = b.call(ctx, msgs)
		stop()
		cancel()
	}

	var be *BatchError
	partial := err != nil && !panicked && errors.As(err, &be)
	failed := 0
	for _, e := range bt.entries {
		if e.result != nil {
			continue // left out: its context had ended
		}
		switch {
		case partial:
			e.result = be.failed[e.msg]
		default:
			e.result = err
		}
		if e.result != nil {
			failed++
		}
	}
	b.mu.Lock()
	b.stats.Failed += int64(failed)
	if panicked {
		b.stats.Panics++
	}
	b.release(bt)
	b.mu.Unlock()
	close(bt.done)
}

// call runs the batch function, turning a panic into an error.
func (b *Batcher) call(ctx context.Context, msgs []*message.Message) (err error, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: in the batch function: %v\n%s", ErrHandlerPanicked, p, strings.TrimSpace(string(debug.Stack())))
			panicked = true
		}
	}()
	return b.fn(ctx, msgs), false
}

// abandonWhenGone cancels the batch's context, and frees its run slot,
// once every message's context has ended: nobody waits for the result any
// more, and a function that never returns must not keep later batches
// from running. The returned stop undoes the watch.
func (b *Batcher) abandonWhenGone(bt *batch, msgs []*message.Message, cancel context.CancelFunc) (stop func()) {
	var mu sync.Mutex
	left := len(msgs)
	stops := make([]func() bool, len(msgs))
	for i, m := range msgs {
		stops[i] = context.AfterFunc(m.Context(), func() {
			mu.Lock()
			left--
			last := left == 0
			mu.Unlock()
			if !last {
				return
			}
			cancel()
			b.mu.Lock()
			if !bt.finished {
				b.stats.Abandoned++
				b.release(bt)
			}
			b.mu.Unlock()
		})
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}
