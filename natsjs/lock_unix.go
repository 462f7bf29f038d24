//go:build unix

package natsjs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// dirLock is an embedded server's hold on its directory: an exclusive
// flock on a file in it, which the kernel releases if the process dies.
type dirLock struct{ f *os.File }

// lockFile is the name of the lock file in an embedded server's directory.
const lockFile = ".natsjs.lock"

// lockDir creates dir if needed and locks it, or fails with ErrDirInUse.
func lockDir(dir string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("natsjs: embedded server directory: %w", err)
	}
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("natsjs: lock %s: %w", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrDirInUse, dir)
		}
		return nil, fmt.Errorf("natsjs: lock %s: %w", path, err)
	}
	return &dirLock{f: f}, nil
}

// release unlocks the directory (closing the file drops the flock).
func (l *dirLock) release() { _ = l.f.Close() }
