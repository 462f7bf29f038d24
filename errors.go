package broker

import (
	"errors"
	"fmt"
)

// Sentinel errors. Returned errors wrap them with context; match them with
// errors.Is.
var (
	// ErrClosed is returned by Publish, Subscribe and Redrive once Close has
	// been called.
	ErrClosed = errors.New("broker: closed")
	// ErrQueueFull is returned by Publish (and Redrive) when the queue stayed
	// full for the whole publish timeout.
	ErrQueueFull = errors.New("broker: queue full")
	// ErrInvalidMessage wraps the reason a message was refused by Publish.
	ErrInvalidMessage = errors.New("broker: invalid message")
	// ErrInvalidOption wraps the reason an option, a subscription argument
	// or a filter was refused.
	ErrInvalidOption = errors.New("broker: invalid option")
	// ErrDuplicateSubscriber is returned by Subscribe when the topic already
	// has an active subscriber of that name.
	ErrDuplicateSubscriber = errors.New("broker: duplicate subscriber")
	// ErrDeadLetterNotFound is returned (joined) by Redrive for an unknown
	// dead-letter ID.
	ErrDeadLetterNotFound = errors.New("broker: dead letter not found")
	// ErrSubscriberNotFound is returned (joined) by Redrive when the
	// subscriber that failed a dead letter is no longer subscribed.
	ErrSubscriberNotFound = errors.New("broker: subscriber not found")
	// ErrUnsubscribed is the cause (context.Cause) of a handler's context
	// cancelled because Unsubscribe's context ended; a handler cancelled by
	// Close sees a cause matching ErrClosed.
	ErrUnsubscribed = errors.New("broker: unsubscribed")
	// ErrLaneFull is the error of a dead letter shed from a subscriber's
	// full lane (reason "overflow").
	ErrLaneFull = errors.New("broker: subscriber lane full")
	// ErrDeadLetterRefused is what a DeadLetterStore's Put wraps when
	// trying again cannot help (the dead letter is too large for it, say):
	// the broker then stops retrying the Put at once, and logs the dead
	// letter with every field and counts it (DeadLetterErrors), as it does
	// for a Put still failing at a stop's deadline.
	ErrDeadLetterRefused = errors.New("broker: dead letter refused by the store")
)

// DrainError is returned by Close and Unsubscribe when their context ended
// before every queued message was finished: the rest were dead-lettered.
// It unwraps to the context's error, so errors.Is(err,
// context.DeadlineExceeded) works; use errors.As to read the count.
type DrainError struct {
	Reason       string // ReasonShutdown or ReasonUnsubscribed
	DeadLettered int    // messages put into the dead-letter store with Reason
	// Abandoned is how many of them were running in handlers that had not
	// returned ShutdownGrace after their context was cancelled: those
	// handlers were left running, and what they return is logged and
	// ignored.
	Abandoned int
	Err       error // the context's error that cut the drain short
}

func (e *DrainError) Error() string {
	s := fmt.Sprintf("broker: drain cut short (%v): %d messages dead-lettered with reason %q",
		e.Err, e.DeadLettered, e.Reason)
	if e.Abandoned > 0 {
		s += fmt.Sprintf(", %d of them in abandoned handlers", e.Abandoned)
	}
	return s
}

// Unwrap returns the context error.
func (e *DrainError) Unwrap() error { return e.Err }
