//go:build !unix

package natsjs

import (
	"fmt"
	"os"
)

// dirLock is an embedded server's hold on its directory. Without flock
// (not Unix) it is not enforced: one server at a time per directory is
// then the caller's duty.
type dirLock struct{}

// lockDir creates dir if needed.
func lockDir(dir string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("natsjs: embedded server directory: %w", err)
	}
	return &dirLock{}, nil
}

func (*dirLock) release() {}
