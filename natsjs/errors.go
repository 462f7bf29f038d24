package natsjs

import "errors"

var (
	// ErrInvalidOption wraps the reason an option or a constructor argument
	// was refused.
	ErrInvalidOption = errors.New("natsjs: invalid option")
	// ErrInvalidDeadLetter wraps the reason DeadLetterStore.Put refused a
	// dead letter (no ID, a time JSON cannot encode).
	ErrInvalidDeadLetter = errors.New("natsjs: invalid dead letter")
	// ErrTooLarge is returned by DeadLetterStore.Put when the encoded dead
	// letter exceeds the server's max_payload (1 MiB by default).
	ErrTooLarge = errors.New("natsjs: dead letter larger than the server's max payload")
	// ErrCorrupt wraps the reason a stored dead letter could not be decoded
	// (a message not written by DeadLetterStore on its subjects).
	ErrCorrupt = errors.New("natsjs: undecodable dead letter")
)
