package browsertest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test ends its browser (the allocator's cancel waits for the process
// and for chromedp's goroutines), its servers and its broker, so no
// goroutine may be left.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
