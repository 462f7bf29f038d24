package brokerprom

import "errors"

// Sentinel errors. Returned errors wrap them with context; match them with
// errors.Is.
var (
	// ErrInvalidOption wraps the reason New refused an option.
	ErrInvalidOption = errors.New("brokerprom: invalid option")
	// ErrNilBroker is returned by Watch when given a nil broker.
	ErrNilBroker = errors.New("brokerprom: nil broker")
)
