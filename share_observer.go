package safeack

import (
	"errors"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ShareAck is an acknowledgement a ShareSubscriber sends for a record
// (KIP-932).
type ShareAck int

const (
	// ShareAccept: the record is done; the broker never delivers it again.
	ShareAccept ShareAck = iota + 1
	// ShareRelease: the record goes back to the share group, to be
	// delivered again with a delivery count one higher.
	ShareRelease
	// ShareReject: the record is archived, never delivered again.
	ShareReject
)

// String names the acknowledgement as the share group protocol does:
// accept, release or reject.
func (a ShareAck) String() string {
	switch a {
	case ShareAccept:
		return "accept"
	case ShareRelease:
		return "release"
	case ShareReject:
		return "reject"
	}
	return "ShareAck(" + strconv.Itoa(int(a)) + ")"
}

// ShareAckReason says why a ShareSubscriber sent the acknowledgement it
// sent for a delivered record.
type ShareAckReason int

const (
	// ShareReasonAnswer: the message's own answer, an Ack (accept) or a
	// Nack below MaxDeliveries (release).
	ShareReasonAnswer ShareAckReason = iota + 1
	// ShareReasonPoison: RejectPoison had the record rejected.
	ShareReasonPoison
	// ShareReasonMaxDeliveries: a Nack at MaxDeliveries, without a
	// DeadLetter: the record is rejected.
	ShareReasonMaxDeliveries
	// ShareReasonDeadLettered: a Nack at MaxDeliveries, and DeadLetter
	// took the record: it is accepted.
	ShareReasonDeadLettered
	// ShareReasonDeadLetterFailed: DeadLetter failed until the
	// subscription stopped: the record is released.
	ShareReasonDeadLetterFailed
	// ShareReasonClosing: the subscription ended before the message was
	// answered (or before its handler ran, with SkipRevoked): the record
	// is released for another member.
	ShareReasonClosing
)

// String names the reason: answer, poison, max_deliveries, dead_lettered,
// dead_letter_failed or closing.
func (r ShareAckReason) String() string {
	switch r {
	case ShareReasonAnswer:
		return "answer"
	case ShareReasonPoison:
		return "poison"
	case ShareReasonMaxDeliveries:
		return "max_deliveries"
	case ShareReasonDeadLettered:
		return "dead_lettered"
	case ShareReasonDeadLetterFailed:
		return "dead_letter_failed"
	case ShareReasonClosing:
		return "closing"
	}
	return "ShareAckReason(" + strconv.Itoa(int(r)) + ")"
}

// ShareAcknowledgement is the acknowledgement sent for one delivery of a
// ShareSubscriber, and the broker's answer to it.
type ShareAcknowledgement struct {
	Ack    ShareAck
	Reason ShareAckReason
	// Err is nil when the broker took the acknowledgement. Otherwise the
	// broker refused it (for example, the acquisition lock had expired:
	// the record is delivered again, as ShareStats.AckErrors counts), the
	// client could not send it, or it wraps ErrShareAckUnconfirmed.
	//
	// The broker answers for a partition's acknowledgements of one
	// request, not for each record: the answer given is the first one
	// for the record's partition that the member received after the
	// acknowledgement was given, and an acknowledgement given while a
	// request for its partition was in flight is reported with that
	// request's answer.
	Err error
}

// ErrShareAckUnconfirmed is ShareAcknowledgement.Err when the member left
// the share group before an answer for the record's partition arrived:
// the acknowledgement was handed to the client, which sends what it holds
// as it leaves, and the broker may have taken it.
var ErrShareAckUnconfirmed = errors.New("safeack: share acknowledgement not confirmed: the member left before the broker answered")

// ShareDeliveryObserver is a DeliveryObserver that is also told of the
// acknowledgement a ShareSubscriber sent for the delivery's record, and
// whether the broker took it. A DeliveryObserver returned by
// Observer.Delivered for a ShareSubscriber's delivery may implement it.
type ShareDeliveryObserver interface {
	DeliveryObserver
	// Acknowledged is called once per delivery, after Answered (the
	// outcome that decided the acknowledgement), once the broker answered
	// the acknowledgement or the member left the group. The answer to a
	// release may come after the record's next delivery: one fetch can
	// carry the release and hand the record out again.
	Acknowledged(a ShareAcknowledgement)
}

// ShareGroup returns the share group the ShareSubscriber was configured
// with.
func (s *ShareSubscriber) ShareGroup() string { return s.cfg.ShareGroup }

// shareOutcome maps why a record was acknowledged to the Outcome its
// DeliveryObserver sees and the acknowledgement's reason.
func shareOutcome(why outcome) (Outcome, ShareAckReason) {
	switch why {
	case outcomeAcked:
		return OutcomeAck, ShareReasonAnswer
	case outcomeNacked:
		return OutcomeNack, ShareReasonAnswer
	case outcomeRejectedPoison:
		return OutcomeNack, ShareReasonPoison
	case outcomeMaxDeliveries:
		return OutcomeNack, ShareReasonMaxDeliveries
	case outcomeDeadLettered:
		return OutcomeNack, ShareReasonDeadLettered
	case outcomeDeadLetterFailed:
		return OutcomeNack, ShareReasonDeadLetterFailed
	case outcomeSkipped:
		return OutcomeSkipped, ShareReasonClosing
	default: // outcomeReleasedAtClose
		return OutcomeAbandoned, ShareReasonClosing
	}
}

func shareAckOf(status kgo.AckStatus) ShareAck {
	switch status {
	case kgo.AckAccept:
		return ShareAccept
	case kgo.AckReject:
		return ShareReject
	default:
		return ShareRelease
	}
}

// observeAnswer tells the delivery's observer what became of it, and
// queues the acknowledgement for the broker's answer. Called once, by
// finish, after the acknowledgement was given to the client.
func (d *shareDelivery) observeAnswer(status kgo.AckStatus, why outcome) {
	if d.obs == nil {
		return
	}
	out, reason := shareOutcome(why)
	var err error
	if out == OutcomeNack {
		d.deferMu.Lock()
		err = d.nackErr
		d.deferMu.Unlock()
	}
	d.obs.Answered(out, err)
	if so, ok := d.obs.(ShareDeliveryObserver); ok {
		d.m.acks.wait(d.rec.Partition, shareAckWait{o: so, ack: ShareAcknowledgement{Ack: shareAckOf(status), Reason: reason}})
	}
}

// shareAckWait is an acknowledgement waiting for the broker's answer.
type shareAckWait struct {
	o   ShareDeliveryObserver
	ack ShareAcknowledgement
}

// shareAckWaits are the acknowledgements of one member waiting for the
// broker's answer, per partition, in the order they were given.
type shareAckWaits struct {
	mu      sync.Mutex
	waiting map[int32][]shareAckWait
}

func (w *shareAckWaits) wait(partition int32, a shareAckWait) {
	w.mu.Lock()
	if w.waiting == nil {
		w.waiting = make(map[int32][]shareAckWait)
	}
	w.waiting[partition] = append(w.waiting[partition], a)
	w.mu.Unlock()
}

// answered reports the broker's answer for a partition to every
// acknowledgement of it waiting.
func (w *shareAckWaits) answered(partition int32, err error) {
	w.mu.Lock()
	waiting := w.waiting[partition]
	delete(w.waiting, partition)
	w.mu.Unlock()
	for _, a := range waiting {
		a.ack.Err = err
		a.o.Acknowledged(a.ack)
	}
}

// left reports the acknowledgements still waiting when the member left.
func (w *shareAckWaits) left() {
	w.mu.Lock()
	var parts []int32
	for p := range w.waiting {
		parts = append(parts, p)
	}
	w.mu.Unlock()
	for _, p := range parts {
		w.answered(p, ErrShareAckUnconfirmed)
	}
}
