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
	// full for the whole publish timeout. When a subscriber's full lane
	// holds the topic (TopicStats.BlockedOn), the error's text names it.
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
// It is also returned when dead letters were lost during the stop (Lost),
// the dead-letter store refusing them until the deadline, and when the
// stop abandoned plugged-in code (Abandoned). It unwraps to
// the context's error, so errors.Is(err, context.DeadlineExceeded) works;
// use errors.As to read the counts.
type DrainError struct {
	Reason       string // ReasonShutdown or ReasonUnsubscribed
	DeadLettered int    // messages dead-lettered with Reason (lost ones included)
	// Abandoned is how many calls of plugged-in code the stop gave up on:
	// handlers (middleware included), store methods and Observer hooks
	// still running four fifths of ShutdownGrace after the handlers'
	// context was cancelled, and any still running at the stop's deadline
	// (ShutdownGrace after its ctx ended, see ShutdownGrace). Those calls
	// were left running, and what they return is logged and ignored. An
	// abandoned handler's message is dead-lettered; the messages a call
	// abandoned at the deadline held count as Lost. With a Transport, it
	// counts the transport's Stop or Close calls still running at the
	// deadline (their messages stay with the transport).
	Abandoned int
	// Lost is how many dead letters (with any reason) the store refused
	// during the stop, until its deadline or for good (ErrDeadLetterRefused):
	// those messages are in no store and no queue. Each was logged at Error
	// with every field and is counted in Stats' DeadLetterErrors. A loss
	// counts in one stop's DrainError: when Close and an Unsubscribe meet,
	// the one that cut the subscription off (else the one called first).
	// The shed messages (WhenLaneFull) whose Put is still running at the
	// deadline count here too. With a Transport it is 0: unfinished
	// messages stay with the transport.
	Lost int
	Err  error // the context's error that cut the drain short; nil if it did not end
}

// Error says how many messages were dead-lettered, abandoned and lost.
func (e *DrainError) Error() string {
	s := fmt.Sprintf("broker: drain cut short (%v): %d messages dead-lettered with reason %q",
		e.Err, e.DeadLettered, e.Reason)
	if e.Err == nil {
		s = fmt.Sprintf("broker: stopped: %d messages dead-lettered with reason %q", e.DeadLettered, e.Reason)
	}
	if e.Abandoned > 0 {
		s += fmt.Sprintf(", %d calls of plugged-in code (handlers, stores, observers) abandoned", e.Abandoned)
	}
	if e.Lost > 0 {
		s += fmt.Sprintf("; %d dead letters lost: the store refused them (logged with every field)", e.Lost)
	}
	return s
}

// Unwrap returns the context error.
func (e *DrainError) Unwrap() error { return e.Err }
