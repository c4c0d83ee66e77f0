package safeack

import (
	"sync"
	"sync/atomic"
)

// subscriptions orders a subscriber's subscriptions against its Close: a
// subscription either starts before Close begins, and Close waits for it,
// or not at all. Subscriber and ShareSubscriber embed it.
type subscriptions struct {
	closing   chan struct{} // closed when Close begins
	closeOnce sync.Once
	closed    atomic.Bool
	// lifecycle orders admit against beginClose; a subscriber also guards
	// with it what it keeps per live subscription.
	lifecycle sync.Mutex
	subs      sync.WaitGroup
}

// admit counts a subscription that is about to run and reports true; once
// Close began it reports false, and the caller undoes the subscription.
func (l *subscriptions) admit() bool {
	l.lifecycle.Lock()
	defer l.lifecycle.Unlock()
	if l.closed.Load() {
		return false
	}
	l.subs.Add(1) // before Close can Wait
	return true
}

// beginClose refuses new subscriptions and closes closing, once.
func (l *subscriptions) beginClose() {
	l.closeOnce.Do(func() {
		l.lifecycle.Lock()
		l.closed.Store(true)
		l.lifecycle.Unlock()
		close(l.closing)
	})
}
