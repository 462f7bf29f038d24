package wallclock

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNowFollowsTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Clock
		for _, step := range []time.Duration{0, time.Millisecond, 300 * time.Millisecond, Refresh, 3 * time.Second, time.Hour} {
			time.Sleep(step)
			got, want := c.Now(), time.Now()
			assert.True(t, got.Equal(want), "after %v: got %v, want %v", step, got, want)
			assert.Equal(t, time.Duration(0), time.Since(got), "carries a monotonic reading")
		}
	})
}

func TestNowIsMonotonicAndCloseToTimeNow(t *testing.T) {
	var c Clock
	prev := c.Now()
	for range 10_000 {
		before := time.Now()
		got := c.Now()
		after := time.Now()
		require.False(t, got.Before(prev), "monotonic")
		require.False(t, got.Before(before) || got.After(after), "between the time.Now readings around it")
		assert.Equal(t, before.Location(), got.Location())
		prev = got
	}
}

func TestConcurrentUse(t *testing.T) {
	var c Clock
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				_ = c.Now()
			}
		})
	}
	wg.Wait()
}

func BenchmarkNow(b *testing.B) {
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			_ = time.Now()
		}
	})
	b.Run("Clock", func(b *testing.B) {
		var c Clock
		for b.Loop() {
			_ = c.Now()
		}
	})
}
