package partition

import (
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Pool is what the workers of one subscription share: the channel their
// messages are handed out on, and the in-flight tokens, one per message
// handed out and not yet answered (the subscription's MaxInFlight).
type Pool struct {
	output  chan<- *message.Message
	tokens  chan struct{}
	size    int
	running atomic.Int32 // workers running, for each one's fair share of the tokens

	// A worker at its share with records ready waits for its own acks to
	// pass their tokens on (see wantsToken), not for the pool's. A token
	// freed with nobody below the share waiting for it wakes such workers
	// (waitingAtShare of them, among the running ones): otherwise it would
	// stay free while records wait, for good when their own handlers wait
	// for those records (a Batcher bounded by MaxInFlight).
	waitingAtShare atomic.Int32
	runningMu      sync.Mutex
	runningWorkers map[*Worker]struct{}
}

// NewPool returns a pool handing messages out on output, with maxInFlight
// tokens (at least one).
func NewPool(output chan<- *message.Message, maxInFlight int) *Pool {
	size := max(maxInFlight, 1)
	return &Pool{output: output, tokens: make(chan struct{}, size), size: size}
}

// share is a worker's fair share of the tokens among the running workers.
func (p *Pool) share() int {
	return max(1, p.size/max(1, int(p.running.Load())))
}

func (p *Pool) release() {
	<-p.tokens
	if p.waitingAtShare.Load() > 0 {
		p.wakeWaitingAtShare()
	}
}

// started and stopped keep the running workers' list.
func (p *Pool) started(w *Worker) {
	p.running.Add(1)
	p.runningMu.Lock()
	defer p.runningMu.Unlock()
	if p.runningWorkers == nil {
		p.runningWorkers = make(map[*Worker]struct{})
	}
	p.runningWorkers[w] = struct{}{}
}

func (p *Pool) stopped(w *Worker) {
	w.stopWaitingAtShare()
	p.runningMu.Lock()
	defer p.runningMu.Unlock()
	delete(p.runningWorkers, w)
	p.running.Add(-1)
}

// wakeWaitingAtShare wakes the workers waiting at their share with records
// ready: the first to loop takes the freed token, the others wait again.
// A token gets here only when no worker below its share waited for it, so
// this is rare under load.
func (p *Pool) wakeWaitingAtShare() {
	p.runningMu.Lock()
	defer p.runningMu.Unlock()
	for w := range p.runningWorkers {
		if w.atShare.Load() {
			w.wakeRun()
		}
	}
}

// waitAtShare marks w, at its share with records ready, as waiting for a
// token nobody else wants. It reports false when one is free already:
// w takes it without waiting.
func (w *Worker) waitAtShare() bool {
	if !w.atShare.Swap(true) {
		w.pool.waitingAtShare.Add(1)
	}
	// Read after the mark: a token freed from here on wakes w.
	return len(w.pool.tokens) == w.pool.size
}

// stopWaitingAtShare undoes waitAtShare.
func (w *Worker) stopWaitingAtShare() {
	if w.atShare.Swap(false) {
		w.pool.waitingAtShare.Add(-1)
	}
}

// pass offers a token its holder is done with to a worker waiting for
// one, and takes it straight back when none is: freeing a slot of a full
// channel hands it to the first blocked sender. It reports whether the
// caller still holds the token.
func (p *Pool) pass() bool {
	<-p.tokens
	select {
	case p.tokens <- struct{}{}:
		return true
	default:
		return false
	}
}
