package slide

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWindowForgetsWhatIsOlderThanItsSpan(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	w := New(10 * time.Second)
	tests := []struct {
		at     time.Duration // after start
		addA   uint64
		addB   uint64
		wantA  uint64
		wantB  uint64
		reason string
	}{
		{0, 1, 2, 1, 2, "first counts"},
		{500 * time.Millisecond, 1, 0, 2, 2, "same bucket adds up"},
		{5 * time.Second, 0, 3, 2, 5, "a later bucket adds to the window"},
		{9900 * time.Millisecond, 0, 0, 2, 5, "still inside the window"},
		{10 * time.Second, 0, 0, 0, 3, "the first bucket left the window"},
		{15 * time.Second, 0, 0, 0, 0, "the second left too"},
		{60 * time.Second, 4, 4, 4, 4, "a bucket reused after a long gap starts from zero"},
	}
	for _, tt := range tests {
		now := start.Add(tt.at)
		w.Add(now, tt.addA, tt.addB)
		a, b := w.Sums(now)
		if a != tt.wantA || b != tt.wantB {
			t.Fatalf("at %v (%s): sums %d, %d; want %d, %d", tt.at, tt.reason, a, b, tt.wantA, tt.wantB)
		}
	}
	w.Reset()
	if a, b := w.Sums(start.Add(60 * time.Second)); a != 0 || b != 0 {
		t.Fatalf("after Reset: %d, %d", a, b)
	}
}
