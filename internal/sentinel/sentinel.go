// Package sentinel declares the sentinel errors that safeack's public API
// re-exports: the internal packages return these very values, so that
// errors.Is holds for the names the root package gives them.
package sentinel

import (
	"errors"
	"fmt"
)

// The errors the root package re-exports under the same names.
var (
	ErrSubscriberClosed = errors.New("safeack: subscriber closed")
	ErrInvalidConfig    = errors.New("safeack: invalid subscriber config")
	ErrNotReady         = errors.New("safeack: not ready")
)

// Field is the error for an invalid config field: it wraps ErrInvalidConfig
// and names the field.
func Field(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
}

// The errors the root package re-exports under the same names.
var (
	ErrInstanceFenced     = errors.New("safeack: consumer group member fenced by another consumer with the same Consumer.Group.InstanceId")
	ErrCommitNotConfirmed = errors.New("safeack: commit not confirmed by the group coordinator")
	ErrAlreadyAnswered    = errors.New("safeack: message already acked or nacked")
)

// Share group errors (the public ones of package safeack).
var (
	ErrShareGroupsUnsupported = errors.New("safeack: the cluster does not serve share groups (KIP-932: Kafka 4.2 or later, with share groups enabled)")
	ErrShareAckUnconfirmed    = errors.New("safeack: share acknowledgement not confirmed: the member left before the broker answered")
	ErrRejected               = errors.New("safeack: record rejected (share group REJECT): archived, never delivered again")
)
