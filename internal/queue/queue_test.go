package queue

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFIFOAcrossGrowthAndWrap(t *testing.T) {
	q := New[int](100, 0)
	next, want := 0, 0
	// Interleave pushes and pops so the ring wraps while it grows.
	for round := range 50 {
		for range round%7 + 1 {
			if push(q, next) == nil {
				next++
			}
		}
		for range round % 5 {
			v, ok := pop(q)
			if !ok {
				break
			}
			require.Equal(t, want, v)
			want++
		}
	}
	for {
		v, ok := pop(q)
		if !ok {
			break
		}
		require.Equal(t, want, v)
		want++
	}
	assert.Equal(t, next, want)
	assert.Equal(t, 0, q.Snapshot().Len)
}

func TestBounds(t *testing.T) {
	q := New[int](3, 0)
	for i := range 3 {
		require.NoError(t, push(q, i))
	}
	assert.ErrorIs(t, push(q, 9), ErrFull)
	assert.Equal(t, 3, q.Snapshot().Len)
	assert.Equal(t, 3, q.Cap())
	st := q.Snapshot()
	assert.Equal(t, 0, st.Head)
	assert.Equal(t, 3, st.Len)
	assert.Equal(t, 1, New[int](0, 0).Cap(), "capacity at least 1")
}

func TestViewKeepsItemsQueuedUntilTaken(t *testing.T) {
	q := New[string](2, 0)
	require.NoError(t, push(q, "a"))
	require.NoError(t, push(q, "b"))
	view, ok := take(q, nil, 1)
	require.True(t, ok)
	assert.Equal(t, []string{"a"}, view, "at most max")
	assert.Equal(t, 2, q.Snapshot().Len, "an item in a view still counts")
	q.TakenN(1)
	assert.Equal(t, 1, q.Snapshot().Len)
	view, ok = take(q, nil, 2)
	require.True(t, ok)
	assert.Equal(t, []string{"b"}, view)
	q.TakenN(0) // no-op
	q.TakenN(-1)
	assert.Equal(t, 1, q.Snapshot().Len)
}

func TestCloseDrains(t *testing.T) {
	q := New[int](4, 0)
	require.NoError(t, push(q, 1))
	q.Close()
	q.Close() // idempotent
	assert.ErrorIs(t, push(q, 2), ErrClosed)
	assert.ErrorIs(t, q.PushWait(2, nil, nil, nil), ErrClosed)
	view, ok := take(q, nil, 4)
	require.True(t, ok, "queued items outlive Close")
	assert.Equal(t, []int{1}, view)
	q.TakenN(1)
	_, ok = take(q, nil, 4)
	assert.False(t, ok, "closed and empty")
}

func TestPushWait(t *testing.T) {
	tests := []struct {
		name    string
		act     func(q *Queue[int], stop chan struct{})
		timeout time.Duration
		want    error
		waited  time.Duration
	}{
		{"room appears", func(q *Queue[int], _ chan struct{}) {
			time.Sleep(time.Second)
			pop(q)
		}, time.Hour, nil, time.Second},
		{"deadline", func(*Queue[int], chan struct{}) {}, 2 * time.Second, ErrTimeout, 2 * time.Second},
		{"stopped", func(_ *Queue[int], stop chan struct{}) {
			time.Sleep(time.Second)
			close(stop)
		}, time.Hour, ErrStopped, time.Second},
		{"closed", func(q *Queue[int], _ chan struct{}) {
			time.Sleep(time.Second)
			q.Close()
		}, time.Hour, ErrClosed, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := New[int](1, 0)
				require.NoError(t, push(q, 0))
				stop := make(chan struct{})
				go tt.act(q, stop)
				timer := time.NewTimer(tt.timeout)
				defer timer.Stop()
				start := time.Now()
				err := q.PushWait(1, stop, nil, timer.C)
				assert.Equal(t, tt.want, err)
				assert.Equal(t, tt.waited, time.Since(start))
				synctest.Wait()
			})
		})
	}
}

func TestManyProducersOneConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const producers, each = 8, 500
		q := New[[2]int](16, 0)
		for p := range producers {
			go func() {
				for i := range each {
					require.NoError(t, q.PushWait([2]int{p, i}, nil, nil, nil))
				}
			}()
		}
		last := make([]int, producers)
		for i := range last {
			last[i] = -1
		}
		for got := 0; got < producers*each; {
			view, ok := take(q, nil, 5)
			require.True(t, ok)
			for _, v := range view { // producers wait for room meanwhile
				require.Equal(t, last[v[0]]+1, v[1], "per-producer order")
				last[v[0]] = v[1]
				q.TakenN(1)
				got++
			}
		}
		q.Close()
		_, ok := take(q, nil, 5)
		assert.False(t, ok)
	})
}

func TestTakeWaitStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New[int](1, 0)
		stop := make(chan struct{})
		go func() {
			time.Sleep(time.Second)
			close(stop)
		}()
		_, ok := take(q, stop, 1)
		assert.False(t, ok)
		require.NoError(t, push(q, 1))
		view, ok := take(q, stop, 1)
		assert.True(t, ok, "an item is reported even when stopped")
		assert.Equal(t, []int{1}, view)
	})
}

func TestViewAcrossWrap(t *testing.T) {
	q := New[int](8, 0)
	for i := range 8 {
		require.NoError(t, push(q, i))
	}
	for range 5 {
		pop(q)
	}
	for i := 8; i < 13; i++ { // wraps around the ring's end
		require.NoError(t, push(q, i))
	}
	view := takeView(t, q, 6)
	assert.Equal(t, []int{5, 6, 7, 8, 9, 10}, view, "a batch goes on past the ring's end")
	assert.Equal(t, 8, q.Snapshot().Len, "items in a batch stay queued")
	q.TakenN(3)
	assert.Equal(t, []int{8, 9, 10, 11}, takeView(t, q, 4))
	q.TakenN(1)
	assert.Equal(t, []int{9, 10, 11, 12}, takeView(t, q, 6))
	st := q.Snapshot()
	assert.Equal(t, 9, st.Head)
	assert.Equal(t, 4, st.Len)
	assert.Equal(t, uint64(13), st.Pushed, "every push counts, taken or not")
	q.TakenN(4)
	assert.Equal(t, 0, q.Snapshot().Len)
}

func takeView[T any](t *testing.T, q *Queue[T], max int) []T {
	t.Helper()
	view, ok := take(q, nil, max)
	require.True(t, ok)
	return view
}

// pop takes and removes the oldest item, as the consumer does; ok is false
// when none is queued.
func pop[T any](q *Queue[T]) (v T, ok bool) {
	if q.Snapshot().Len == 0 {
		return v, false
	}
	view := q.Peek(make([]T, 1))
	q.TakenN(1)
	return view[0], true
}

// tryPushN pushes vs in order while they fit, and returns how many did.
func tryPushN[T any](q *Queue[T], vs []T) (int, error) {
	for k, v := range vs {
		if err := push(q, v); err != nil {
			if err == ErrFull {
				err = nil
			}
			return k, err
		}
	}
	return len(vs), nil
}

// take is the consumer's Wait, then Peek into a new buffer of max items.
func take[T any](q *Queue[T], stop <-chan struct{}, max int) ([]T, bool) {
	if !q.Wait(stop) {
		return nil, false
	}
	return q.Peek(make([]T, max)), true
}

// push is TryPush by a producer that never steps in: it wakes the
// consumer when TryPush did not.
func push[T any](q *Queue[T], v T) error {
	idle, err := q.TryPush(v, 0)
	if idle {
		q.Wake()
	}
	return err
}

// A view stays valid and unchanged while producers push and the ring grows
// under it; it is the consumer's until it removes the items.
func TestViewSurvivesGrowth(t *testing.T) {
	const minAlloc = 16 // more than the ring's first size
	q := New[int](1024, 0)
	for i := range minAlloc {
		require.NoError(t, push(q, i))
	}
	view := takeView(t, q, minAlloc)
	require.Len(t, view, minAlloc)
	for i := minAlloc; i < 200; i++ { // grows the ring several times
		require.NoError(t, push(q, i))
	}
	for i, v := range view {
		assert.Equal(t, i, v)
	}
	q.TakenN(minAlloc)
	assert.Equal(t, 200-minAlloc, q.Snapshot().Len)
	v, ok := pop(q)
	assert.True(t, ok)
	assert.Equal(t, minAlloc, v, "order kept across growth")
}

func TestTakeWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New[int](4, 0)
		go func() {
			time.Sleep(time.Second)
			_, _ = tryPushN(q, []int{1, 2, 3})
			time.Sleep(time.Second)
			q.Close()
		}()
		start := time.Now()
		view, ok := take(q, nil, 2)
		require.True(t, ok)
		assert.Equal(t, time.Second, time.Since(start))
		assert.Equal(t, []int{1, 2}, view, "at most max")

		q.TakenN(1)
		assert.Equal(t, 2, q.Snapshot().Len, "a taken item leaves the count at once")
		st := q.Snapshot()
		assert.Equal(t, 2, st.Head, "Head skips taken items")
		assert.Equal(t, 2, st.Len)

		require.NoError(t, push(q, 4))
		require.NoError(t, push(q, 5), "a taken item's slot is free for a producer")
		assert.ErrorIs(t, push(q, 6), ErrFull)

		view, ok = take(q, nil, 8)
		require.True(t, ok)
		assert.Equal(t, []int{2, 3, 4, 5}, view, "a batch goes on past the ring's end")
		for range view {
			q.TakenN(1)
		}
		_, ok = take(q, nil, 8)
		assert.False(t, ok, "closed and empty")
		assert.Equal(t, 2*time.Second, time.Since(start))
		assert.Equal(t, 0, q.Snapshot().Len)

		stop := make(chan struct{})
		close(stop)
		_, ok = take(New[int](1, 0), stop, 1)
		assert.False(t, ok, "stopped")
	})
}

// A producer waiting for room is woken when the consumer marks items it
// took.
func TestTakenMakesRoomForAWaitingProducer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New[int](1, 0)
		require.NoError(t, push(q, 1))
		view, ok := take(q, nil, 1)
		require.True(t, ok)
		require.Equal(t, []int{1}, view)
		assert.ErrorIs(t, push(q, 2), ErrFull, "not taken yet")
		q.TakenN(1)
		require.NoError(t, push(q, 2), "the taken item made room")
		done := make(chan error)
		go func() { done <- q.PushWait(3, nil, nil, nil) }()
		synctest.Wait()
		view, ok = take(q, nil, 1)
		require.True(t, ok)
		require.Equal(t, []int{2}, view)
		q.TakenN(1) // a producer waits: woken
		assert.NoError(t, <-done, "room while the consumer works on the item it took")
		assert.Equal(t, 1, q.Snapshot().Len)
		view, ok = take(q, nil, 1)
		require.True(t, ok)
		assert.Equal(t, []int{3}, view)
	})
}

// A consumer that marks more items taken than are queued (a bug) loses no
// item pushed later: the excess is dropped.
func TestTakenNBeyondTheQueue(t *testing.T) {
	q := New[int](3, 0)
	_, _ = tryPushN(q, []int{1, 2, 3})
	require.Len(t, takeView(t, q, 3), 3)
	q.TakenN(5)
	k, err := tryPushN(q, []int{4, 5, 6})
	require.NoError(t, err)
	require.Equal(t, 3, k)
	assert.Equal(t, []int{4, 5, 6}, takeView(t, q, 3), "nothing unread removed")
	assert.Equal(t, 3, q.Snapshot().Len)
}

// stressItem carries a checksum so that a slot overwritten or read torn
// while the consumer still reads it shows.
type stressItem struct {
	p, i int
	sum  [6]int
}

func newStressItem(p, i int) stressItem {
	it := stressItem{p: p, i: i}
	for k := range it.sum {
		it.sum[k] = p*1_000_003 + i + k
	}
	return it
}

func (it stressItem) intact() bool { return it == newStressItem(it.p, it.i) }

// Producers mixing PushWait and TryPush into small queues, a
// consumer taking random views and marking items taken in random
// steps, and a Stats-like reader: order per producer, intact items, counts
// in range throughout, exact at the end, and no producer left signalled as
// waiting. Run with -race.
func TestConcurrentTakeStress(t *testing.T) {
	for _, capacity := range []int{1, 2, 3, 5, 17, 40} {
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			const producers, each = 6, 2000
			q := New[stressItem](capacity, 0)
			var wg sync.WaitGroup
			for p := range producers {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(p), 1))
					for i := 0; i < each; {
						switch r.IntN(3) {
						case 0:
							if err := q.PushWait(newStressItem(p, i), nil, nil, nil); err != nil {
								t.Error(err)
								return
							}
							i++
						case 1:
							if push(q, newStressItem(p, i)) == nil {
								i++
							}
						default:
							vs := make([]stressItem, min(each-i, 1+r.IntN(4)))
							for k := range vs {
								vs[k] = newStressItem(p, i+k)
							}
							k, _ := tryPushN(q, vs)
							i += k
						}
					}
				})
			}
			stop := make(chan struct{})
			var bad atomic.Int64
			var reader sync.WaitGroup
			reader.Go(func() {
				var pushed uint64
				for {
					select {
					case <-stop:
						return
					default:
					}
					st := q.Snapshot()
					if st.Len < 0 || st.Len > capacity || st.Pushed < pushed || (st.Len > 0 && !st.Head.intact()) {
						bad.Add(1)
					}
					pushed = st.Pushed
				}
			})
			r := rand.New(rand.NewPCG(99, uint64(capacity)))
			last := make([]int, producers)
			for i := range last {
				last[i] = -1
			}
			for got := 0; got < producers*each; {
				view := takeView(t, q, 1+r.IntN(8))
				for i := 0; i < len(view); {
					k := 1 + r.IntN(len(view)-i)
					for _, v := range view[i : i+k] {
						require.True(t, v.intact(), "item %+v", v)
						require.Equal(t, last[v.p]+1, v.i, "order of producer %d", v.p)
						last[v.p] = v.i
					}
					if r.IntN(2) == 0 {
						q.TakenN(k)
					} else {
						for range k {
							q.TakenN(1)
						}
					}
					got, i = got+k, i+k
				}
			}
			wg.Wait()
			close(stop)
			reader.Wait()
			assert.Zero(t, bad.Load(), "snapshots out of range")
			assert.Equal(t, Snapshot[stressItem]{Pushed: producers * each}, q.Snapshot())
			assert.False(t, q.room.Waiting(), "no producer waits")
		})
	}
}

// TestRange reads items by their push number across the ring's wrap, and
// skips what has left the queue (popped or taken).
func TestRange(t *testing.T) {
	q := New[int](8, 0)
	for i := range 6 {
		require.NoError(t, push(q, i))
	}
	for range 4 {
		_, ok := pop(q)
		require.True(t, ok)
	}
	for i := 6; i < 12; i++ { // wraps: the ring holds 4 and 5, then these
		require.NoError(t, push(q, i))
	}
	batch, ok := take(q, nil, 2)
	require.True(t, ok)
	require.Equal(t, []int{4, 5}, batch)
	q.TakenN(2) // taken: gone

	tests := []struct {
		from, to uint64
		want     []int
	}{
		{0, 4, nil},      // popped
		{2, 7, []int{6}}, // the popped and taken part skipped
		{4, 12, []int{6, 7, 8, 9, 10, 11}},
		{9, 20, []int{9, 10, 11}}, // nothing pushed past 11
		{7, 7, nil},
		{8, 3, nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d-%d", tc.from, tc.to), func(t *testing.T) {
			assert.Equal(t, tc.want, q.Range(tc.from, tc.to, nil))
		})
	}
	assert.Equal(t, []int{-1, 6, 7}, q.Range(6, 8, []int{-1}), "appends to buf")
}

// TestTryPushIdle: a push into an empty queue whose consumer sleeps says
// so and does not wake it; any other push wakes a sleeping consumer; Wake
// wakes it.
func TestTryPushIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New[int](4, 0)
		idle, err := q.TryPush(1, 0)
		require.NoError(t, err)
		assert.False(t, idle, "the consumer is not asleep")
		q.Peek(make([]int, 1))
		q.TakenN(1)

		woke := make(chan bool)
		go func() { woke <- q.Wait(nil) }()
		synctest.Wait() // the consumer sleeps on an empty queue
		idle, err = q.TryPush(2, 0)
		require.NoError(t, err)
		assert.True(t, idle, "the only item, the consumer asleep")
		synctest.Wait()
		select {
		case <-woke:
			t.Fatal("an idle push woke the consumer")
		default:
		}
		idle, err = q.TryPush(3, 0)
		require.NoError(t, err)
		assert.False(t, idle, "another item is not taken yet")
		assert.True(t, <-woke, "a push behind an untaken item wakes the consumer")

		q.Peek(make([]int, 2))
		q.TakenN(2)
		go func() { woke <- q.Wait(nil) }()
		synctest.Wait()
		idle, _ = q.TryPush(4, 0)
		require.True(t, idle)
		q.Wake()
		assert.True(t, <-woke, "Wake wakes a sleeping consumer")
	})
}

// TestTryPushIdleGap: a push into an empty queue whose consumer sleeps is
// idle only when the previous push was at least the idle gap before it;
// one that is not wakes the consumer.
func TestTryPushIdleGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New[int](4, 10)
		tests := []struct {
			at   int64
			idle bool
		}{
			{at: 100, idle: true}, // 100 after the zero start
			{at: 105, idle: false},
			{at: 114, idle: false}, // the gap counts from the last push
			{at: 124, idle: true},
		}
		for _, tc := range tests {
			woke := make(chan bool)
			go func() { woke <- q.Wait(nil) }()
			synctest.Wait() // the consumer sleeps on an empty queue
			idle, err := q.TryPush(int(tc.at), tc.at)
			require.NoError(t, err)
			assert.Equal(t, tc.idle, idle, "push at %d", tc.at)
			if idle {
				q.Wake()
			}
			assert.True(t, <-woke)
			q.Peek(make([]int, 1))
			q.TakenN(1)
		}
	})
}
