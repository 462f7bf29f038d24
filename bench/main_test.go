package bench

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: every
// implementation's Close must end what it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
