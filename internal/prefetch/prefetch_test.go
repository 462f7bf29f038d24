package prefetch

import (
	"testing"
	"unsafe"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Line is a hint: any address, even one that is not mapped, is fine and
// nothing changes.
func TestLineIsOnlyAHint(t *testing.T) {
	buf := make([]uint64, 64)
	for i := range buf {
		buf[i] = uint64(i)
	}
	for i := range buf {
		Line(unsafe.Pointer(&buf[i]))
	}
	Line(nil)
	for i, v := range buf {
		if v != uint64(i) {
			t.Fatalf("buf[%d] = %d after a prefetch", i, v)
		}
	}
}
