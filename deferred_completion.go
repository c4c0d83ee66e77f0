package safeack

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrNoDeferredCompletion is returned by CompletionFromCtx for a context
// that did not come through the DeferredCompletion middleware.
var ErrNoDeferredCompletion = errors.New("safeack: no deferred completion in context; add safeack.DeferredCompletion to the router or handler")

type completionCtxKey struct{}

// completionSlot is what DeferredCompletion puts into a message's context:
// the delivery, and the Completion once the handler took it.
type completionSlot struct {
	msg     *message.Message
	foreign bool // not delivered by a safeack Subscriber
	taken   atomic.Pointer[Completion]
}

// DeferredCompletion is router middleware that lets a handler, or code it
// calls with the message's context, take the message's completion with
// CompletionFromCtx and return at once — typically after handing the
// message's effect to an asynchronous batching writer. For a message of a
// safeack Subscriber the handler's return then frees its slot, and the
// record completes (the commit may pass it) only when the Completion
// reports Done; Fail redelivers it, as a Nack would. It is Defer, reachable
// from the context.
//
// With any other subscriber it works unchanged, at the cost of the slot:
// after the handler returned nil having taken the Completion, the
// middleware waits for it and returns nil on Done, the error on Fail, or
// the context's error when the message's context ends first.
//
// A handler that takes the Completion and then returns an error gets the
// error's usual treatment (retry, poison queue, Nack); if the delivery ends
// nacked, the Completion changes nothing. For a safeack message, every
// attempt of one delivery (under middleware.Retry) gets the same
// Completion, and once taken it decides for the delivery: when a later
// attempt returns nil without taking it, the record still waits for it.
// Put DeferredCompletion inside Retry.
//
// Behind middleware.InstantAck the message is acked before the handler
// runs, so CompletionFromCtx gives ErrAlreadyAnswered: InstantAck defeats
// the completed-prefix guarantee and must not be used with safeack.
func DeferredCompletion(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		_, ours := recordFromCtx(msg.Context())
		slot := &completionSlot{msg: msg, foreign: !ours}
		ctx := context.WithValue(msg.Context(), completionCtxKey{}, slot)
		msg.SetContext(ctx)
		events, err := h(msg)
		if ours || err != nil {
			return events, err
		}
		c := slot.taken.Load()
		if c == nil {
			return events, nil
		}
		select {
		case err := <-c.result:
			return events, err
		case <-ctx.Done():
			return events, ctx.Err()
		}
	}
}

// CompletionFromCtx returns the Completion of the message whose handler
// runs with ctx (see DeferredCompletion); every call for one delivery
// returns the same Completion, which is also the one Defer returns. It
// gives ErrNoDeferredCompletion when ctx did not come through
// DeferredCompletion, and ErrAlreadyAnswered when the message was acked or
// nacked already.
func CompletionFromCtx(ctx context.Context) (*Completion, error) {
	slot, ok := ctx.Value(completionCtxKey{}).(*completionSlot)
	if !ok {
		return nil, ErrNoDeferredCompletion
	}
	if c := slot.taken.Load(); c != nil {
		return c, nil
	}
	if !slot.foreign {
		c, err := Defer(slot.msg)
		if err != nil {
			return nil, err
		}
		slot.taken.CompareAndSwap(nil, c)
		return c, nil
	}
	select {
	case <-slot.msg.Acked():
		return nil, ErrAlreadyAnswered
	case <-slot.msg.Nacked():
		return nil, ErrAlreadyAnswered
	default:
	}
	slot.taken.CompareAndSwap(nil, &Completion{result: make(chan error, 1)})
	return slot.taken.Load(), nil
}
