package partition

import (
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

func (p *Pool) release() { <-p.tokens }

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
