package consume

import (
	"errors"
	"time"

	"github.com/IBM/sarama"

	"github.com/safeack/safeack/internal/backoff"
)

// rejoinWindow is how long consumeGroup retries a failed join with the
// same consumer group before it replaces the Sarama client: twice the
// session timeout from the first failure, or from the last one that says
// the group is being moved (coordinatorMoving). A coordinator that died is
// replaced once the cluster fences its broker (broker.session.timeout.ms,
// typically about a consumer session timeout, more on a loaded machine),
// and the new one keeps the group's members for a session timeout after
// it loaded the group; all that time the member id is worth keeping. A
// member that gives up early joins under a new id, and the whole group
// waits for the old one to expire. After the window a new client, from the
// configured Brokers, is the better bet.
func rejoinWindow(conf *sarama.Config) time.Duration {
	return 2 * conf.Consumer.Group.Session.Timeout
}

// rejoinRetry paces the retries of a failed join (backoff.Doubling: 100 ms
// after the first failure, doubling up to 1 s), within a window that
// starts at the first failure since the last successful Consume, and again
// at each failure that says the group is being moved.
type rejoinRetry struct {
	first    time.Time
	backoff  backoff.Doubling
	failures int
}

func (r *rejoinRetry) reset() { *r = rejoinRetry{} }

// next records a failure at now and returns how long to wait before the
// next attempt, or false when the window is over (the caller gives up on
// this consumer group). moving restarts the window (see coordinatorMoving).
func (r *rejoinRetry) next(now time.Time, window time.Duration, moving bool) (time.Duration, bool) {
	r.failures++
	if r.first.IsZero() {
		r.first = now
		r.backoff.Reset()
	}
	wait := r.backoff.Next()
	if moving {
		r.first = now
	}
	left := window - now.Sub(r.first)
	if left <= 0 {
		return 0, false
	}
	return min(wait, left), true
}

// needsAttention tells a failed join that waiting alone will not mend (the
// topic does not exist, a permission is missing): logged as an Error at
// once, where a coordinator on the move is logged at Info.
func needsAttention(err error) bool {
	return errors.Is(err, sarama.ErrUnknownTopicOrPartition) ||
		errors.Is(err, sarama.ErrTopicAuthorizationFailed) ||
		errors.Is(err, sarama.ErrGroupAuthorizationFailed) ||
		errors.Is(err, sarama.ErrClusterAuthorizationFailed)
}

// coordinatorMoving tells whether a failed join was answered by a broker
// that says the group's coordinator is moving or loading the group (the
// errors Sarama itself retries a join on): the group, and its members, are
// on their way to the new coordinator.
func coordinatorMoving(err error) bool {
	return errors.Is(err, sarama.ErrNotCoordinatorForConsumer) ||
		errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable) ||
		errors.Is(err, sarama.ErrOffsetsLoadInProgress) ||
		errors.Is(err, sarama.ErrRebalanceInProgress)
}
