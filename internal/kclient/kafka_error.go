package kclient

import (
	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
)

// KafkaError is the error of a Kafka error code in an answer read through
// franz-go, as both clients name it: errors.Is matches franz-go's kerr
// value and Sarama's KError of the same code, so that an answer read
// through either client is told apart the same way (the public API
// documents Sarama's, e.g. sarama.ErrGroupAuthorizationFailed). Nil for
// code 0.
func KafkaError(code int16) error {
	err := kerr.ErrorForCode(code)
	if err == nil {
		return nil
	}
	return codeError{err: err, sarama: sarama.KError(code)}
}

type codeError struct {
	err    error // franz-go's: its text names the code
	sarama sarama.KError
}

func (e codeError) Error() string   { return e.err.Error() }
func (e codeError) Unwrap() []error { return []error{e.err, e.sarama} }
