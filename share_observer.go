package safeack

import (
	"context"
	"strconv"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/safeack/safeack/internal/sentinel"
	"github.com/safeack/safeack/internal/share"
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
	// ShareReasonGivenBack: the record waited half its acquisition lock
	// for a handler, with none about to take it, and was released
	// without being handed out (ShareCounters.GivenBack).
	ShareReasonGivenBack
)

// String names the reason: answer, poison, max_deliveries, dead_lettered,
// dead_letter_failed, closing or given_back.
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
	case ShareReasonGivenBack:
		return "given_back"
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
// the share group before an answer for the record's partition arrived
// (the acknowledgement was handed to the client, which sends what it holds
// as it leaves, and the broker may have taken it), and when the
// acknowledgement was given after the record's acquisition lock ended
// (the broker may have given the record to another member, and its answer
// for the partition does not tell).
var ErrShareAckUnconfirmed = sentinel.ErrShareAckUnconfirmed

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

// shareObserver is the share.Observer of a ShareSubscriber over the
// configured Observer.
type shareObserver struct {
	o     Observer
	group string
}

func (a shareObserver) Delivered(ctx context.Context, rec *sarama.ConsumerMessage, msg *message.Message, deliveryCount int32) (context.Context, share.DeliveryObserver) {
	ctx, d := a.o.Delivered(ctx, Delivery{Group: a.group, Record: rec, Message: msg, DeliveryCount: deliveryCount})
	if d == nil {
		return ctx, nil
	}
	return ctx, &shareDeliveryObserver{o: d}
}

// shareDeliveryObserver tells a DeliveryObserver what became of a share
// delivery, and a ShareDeliveryObserver the acknowledgement sent.
type shareDeliveryObserver struct {
	o   DeliveryObserver
	ack ShareAcknowledgement
}

func (s *shareDeliveryObserver) Deferred() { s.o.Answered(OutcomeDeferred, nil) }

func (s *shareDeliveryObserver) Answered(status kgo.AckStatus, why share.Reason, err error) bool {
	out, reason := shareOutcome(why)
	if out != OutcomeNack {
		err = nil
	}
	s.o.Answered(out, err)
	if _, ok := s.o.(ShareDeliveryObserver); !ok {
		return false
	}
	s.ack = ShareAcknowledgement{Ack: shareAckOf(status), Reason: reason}
	return true
}

func (s *shareDeliveryObserver) Acknowledged(err error) {
	a := s.ack
	a.Err = err
	s.o.(ShareDeliveryObserver).Acknowledged(a)
}

// shareOutcome maps why a record was acknowledged to the Outcome its
// DeliveryObserver sees and the acknowledgement's reason.
func shareOutcome(why share.Reason) (Outcome, ShareAckReason) {
	switch why {
	case share.Acked:
		return OutcomeAck, ShareReasonAnswer
	case share.Nacked:
		return OutcomeNack, ShareReasonAnswer
	case share.RejectedPoison:
		return OutcomeNack, ShareReasonPoison
	case share.MaxDeliveries:
		return OutcomeNack, ShareReasonMaxDeliveries
	case share.DeadLettered:
		return OutcomeNack, ShareReasonDeadLettered
	case share.DeadLetterFailed:
		return OutcomeNack, ShareReasonDeadLetterFailed
	case share.Skipped:
		return OutcomeSkipped, ShareReasonClosing
	case share.GivenBack:
		return OutcomeAbandoned, ShareReasonGivenBack
	default: // share.ReleasedAtClose, share.LockExpired (not handed out)
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
