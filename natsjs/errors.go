package natsjs

import (
	"errors"
	"fmt"

	"github.com/inproc/broker"
)

var (
	// ErrInvalidOption wraps the reason an option or a constructor argument
	// was refused.
	ErrInvalidOption = errors.New("natsjs: invalid option")
	// ErrInvalidDeadLetter wraps the reason DeadLetterStore.Put refused a
	// dead letter (no ID, a time JSON cannot encode). It wraps
	// broker.ErrDeadLetterRefused: trying again cannot help.
	ErrInvalidDeadLetter = fmt.Errorf("natsjs: invalid dead letter (%w)", broker.ErrDeadLetterRefused)
	// ErrTooLarge is returned by DeadLetterStore.Put when the encoded dead
	// letter, with the publish's headers, exceeds the server's max_payload
	// (1 MiB by default). It wraps
	// broker.ErrDeadLetterRefused: the broker does not retry such a Put.
	ErrTooLarge = fmt.Errorf("natsjs: dead letter larger than the server's max payload (%w)", broker.ErrDeadLetterRefused)
	// ErrCorrupt wraps the reason a stored dead letter could not be decoded
	// (a message not written by DeadLetterStore on its subjects).
	ErrCorrupt = errors.New("natsjs: undecodable dead letter")
	// ErrDirInUse is returned by Embedded (and Open) for a directory that
	// an embedded server of this or another process has open: two servers
	// writing the same files would lose messages.
	ErrDirInUse = errors.New("natsjs: directory in use by another embedded server")
)
