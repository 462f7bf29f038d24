package broker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMemoryIdempotencyStore(t *testing.T) {
	bubble(t, func(t *testing.T) {
		ctx := context.Background()
		s := NewMemoryIdempotencyStore(time.Minute, 1000)
		k := DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "m"}
		seen, err := s.Seen(ctx, k)
		require.NoError(t, err)
		assert.False(t, seen)
		require.NoError(t, s.Record(ctx, k))
		seen, _ = s.Seen(ctx, k)
		assert.True(t, seen)
		for _, other := range []DeliveryKey{
			{Topic: "t", Subscriber: "other", MessageID: "m"},
			{Topic: "u", Subscriber: "s", MessageID: "m"},
			{Topic: "t", Subscriber: "s", MessageID: "n"},
		} {
			seen, _ = s.Seen(ctx, other)
			assert.False(t, seen, "%+v", other)
		}
		time.Sleep(59 * time.Second)
		seen, _ = s.Seen(ctx, k)
		assert.True(t, seen, "inside the window")
		require.NoError(t, s.Record(ctx, k)) // recorded again: the window restarts
		time.Sleep(30 * time.Second)
		seen, _ = s.Seen(ctx, k)
		assert.True(t, seen, "the second record restarted the window")
		time.Sleep(31 * time.Second)
		seen, _ = s.Seen(ctx, k)
		assert.False(t, seen, "after the window")
	})
}

func TestMemoryIdempotencyStoreIsBounded(t *testing.T) {
	tests := []struct{ max, wantCap, record int }{{1, 8, 20}, {3, 8, 100}, {100, 100, 1000}, {1000, 1000, 5000}}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.max), func(t *testing.T) {
			ctx := context.Background()
			s := NewMemoryIdempotencyStore(time.Hour, tt.max)
			require.Equal(t, tt.wantCap, s.Cap())
			for i := range tt.record {
				require.NoError(t, s.Record(ctx, DeliveryKey{Topic: "t", Subscriber: "s", MessageID: fmt.Sprint(i)}))
				require.LessOrEqual(t, s.Len(), s.Cap())
			}
			last := DeliveryKey{Topic: "t", Subscriber: "s", MessageID: fmt.Sprint(tt.record - 1)}
			seen, _ := s.Seen(ctx, last)
			assert.True(t, seen, "the newest entry is kept")
			first := DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "0"}
			seen, _ = s.Seen(ctx, first)
			assert.False(t, seen, "the oldest entry was forgotten")
		})
	}
}

func TestMemoryIdempotencyStoreRetention(t *testing.T) {
	// Filled to half its bound, the table keeps nearly everything.
	ctx := context.Background()
	s := NewMemoryIdempotencyStore(time.Hour, 10_000)
	for i := range 5_000 {
		require.NoError(t, s.Record(ctx, DeliveryKey{MessageID: fmt.Sprint(i)}))
	}
	kept := 0
	for i := range 5_000 {
		if seen, _ := s.Seen(ctx, DeliveryKey{MessageID: fmt.Sprint(i)}); seen {
			kept++
		}
	}
	assert.Greater(t, kept, 4_995, "kept %d of 5000", kept)
	assert.Equal(t, kept, s.Len())
}

func TestMemoryIdempotencyStoreForgetsExpired(t *testing.T) {
	bubble(t, func(t *testing.T) {
		ctx := context.Background()
		s := NewMemoryIdempotencyStore(time.Second, 1_000_000)
		for i := range 10_000 {
			require.NoError(t, s.Record(ctx, DeliveryKey{MessageID: fmt.Sprint(i)}))
		}
		assert.Equal(t, 10_000, s.Len())
		time.Sleep(time.Second)
		seen, _ := s.Seen(ctx, DeliveryKey{MessageID: "0"})
		assert.False(t, seen, "expired")
		assert.Zero(t, s.Len())
	})
}

func TestIdempotencyStoreFailureStillDelivers(t *testing.T) {
	bubble(t, func(t *testing.T) {
		b := newTestBroker(t, WithIdempotencyStore(brokenIdem{}))
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 2)
		idle()
		assert.Equal(t, 2, got.len(), "a failing dedup store never loses a message")
	})
}

// brokenIdem fails every call.
type brokenIdem struct{}

func (brokenIdem) Seen(context.Context, DeliveryKey) (bool, error) { return false, errBoom }
func (brokenIdem) Record(context.Context, DeliveryKey) error       { return errBoom }

// The broker's hashed fast path and the store's public methods agree.
func TestMemoryIdempotencyStoreFastPathAgrees(t *testing.T) {
	bubble(t, func(t *testing.T) {
		store := NewMemoryIdempotencyStore(time.Minute, 1000)
		ctx := context.Background()
		require.NoError(t, store.Record(ctx, DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "recorded-outside"}))
		b := newTestBroker(t, WithIdempotencyStore(store))
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		publishN(t, b, "t", "m", 1)
		require.NoError(t, b.Publish(ctx, Message{ID: "recorded-outside", Topic: "t"}))
		idle()
		assert.Equal(t, []string{"m-0"}, got.ids())
		seen, err := store.Seen(ctx, DeliveryKey{Topic: "t", Subscriber: "s", MessageID: "m-0"})
		require.NoError(t, err)
		assert.True(t, seen, "recorded by the broker, visible through Seen")
		seen, _ = store.Seen(ctx, DeliveryKey{Topic: "t", Subscriber: "other", MessageID: "m-0"})
		assert.False(t, seen)
	})
}

// The window is in publish time: whether a message is a duplicate depends
// on when it and the delivered copy were published, not on how long either
// waited in a queue or for a retry.
func TestDedupWindowIsInPublishTime(t *testing.T) {
	t.Run("a copy published within the window is a duplicate, delivered after it", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			b, _, got := windowBroker(t, 1, func(m Message) error {
				if m.ID == "x" {
					return errBoom // waits out a 2 min backoff, holding the lane
				}
				return nil
			})
			time.Sleep(time.Second) // the store's clock is not at its epoch
			publishIDs(t, b, "m", "x")
			time.Sleep(59 * time.Second)
			publishIDs(t, b, "m") // runs 2 min later, past the first m's window
			settle(t, b)
			assert.Equal(t, []string{"m", "x", "x"}, got.ids())
			assert.Equal(t, uint64(1), subStats(t, b, "t", "s").Deduplicated)
		})
	})
	t.Run("a copy published after the window is not, while the subscriber is behind", func(t *testing.T) {
		bubble(t, func(t *testing.T) {
			b, _, got := windowBroker(t, 1, func(m Message) error {
				if m.ID == "x" {
					return errBoom
				}
				return nil
			})
			publishIDs(t, b, "m", "x")
			time.Sleep(61 * time.Second)
			publishIDs(t, b, "m") // runs while x waits for its retry
			settle(t, b)
			assert.Equal(t, []string{"m", "x", "m", "x"}, got.ids())
		})
	})
	// Concurrency 2, the copies with different Keys: the earlier copy waits
	// behind a blocked message while the later one is delivered.
	for _, tt := range []struct {
		gap  time.Duration
		runs int
	}{{30 * time.Second, 1}, {2 * time.Minute, 2}} {
		t.Run(fmt.Sprintf("an earlier copy delivered after a later one, %v apart", tt.gap), func(t *testing.T) {
			bubble(t, func(t *testing.T) {
				release := make(chan struct{})
				b, _, got := windowBroker(t, 2, func(m Message) error {
					if m.ID == "blocker" {
						<-release
					}
					return nil
				})
				k1, k2 := "k1", "k2" // the second worker takes k2 while the first runs k1
				require.NoError(t, b.Publish(context.Background(), Message{ID: "blocker", Topic: "t", Key: k1}))
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t", Key: k1})) // behind blocker
				time.Sleep(tt.gap)
				require.NoError(t, b.Publish(context.Background(), Message{ID: "m", Topic: "t", Key: k2})) // delivered first
				idle()
				close(release)
				settle(t, b)
				assert.Equal(t, tt.runs, len(got.attempts("m")))
				assert.Equal(t, uint64(2-tt.runs), subStats(t, b, "t", "s").Deduplicated)
			})
		})
	}
}

// windowBroker returns a broker with a one-minute dedup window, no retry
// backoff but 2 min, and subscriber "s" of topic "t" with the given
// concurrency, recording its calls and returning ret's error.
func windowBroker(t *testing.T, concurrency int, ret func(Message) error) (*Broker, *Subscription, *calls) {
	b := newTestBroker(t, WithIdempotencyStore(NewMemoryIdempotencyStore(time.Minute, 100)),
		WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(2 * time.Minute)}))
	got := &calls{}
	sub, err := b.Subscribe("t", "s", recording(got, ret), Concurrency(concurrency))
	require.NoError(t, err)
	return b, sub, got
}

func publishIDs(t *testing.T, b *Broker, ids ...string) {
	for _, id := range ids {
		require.NoError(t, b.Publish(context.Background(), Message{ID: id, Topic: "t"}))
	}
}

// A redriven dead letter counts as published again when its redelivery
// starts, not when it was first published long before.
func TestRedrivenDeadLetterIsRememberedFromItsRedelivery(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var fail atomic.Bool
		fail.Store(true)
		b, _, got := windowBroker(t, 1, func(Message) error {
			if fail.Load() {
				return Permanent(errBoom)
			}
			return nil
		})
		publishIDs(t, b, "m")
		idle()
		dls := deadLetters(t, b)
		require.Len(t, dls, 1)
		time.Sleep(10 * time.Minute)
		fail.Store(false)
		n, err := b.Redrive(context.Background(), dls[0].ID)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		idle()
		time.Sleep(59 * time.Second)
		publishIDs(t, b, "m")
		settle(t, b)
		assert.Equal(t, []string{"m", "m"}, got.ids(), "the copy published after the redelivery is a duplicate")
	})
}

// The store compares dates both ways: an entry matches lookups dated less
// than the window before or after it.
func TestMemoryIdempotencyStoreDates(t *testing.T) {
	const w = int64(time.Minute)
	s := NewMemoryIdempotencyStore(time.Minute, 100)
	salt := s.salt("t", "s")
	h := s.hashID("m")
	const at = 10 * w
	s.record(s.slotFor(salt, h, at))
	tests := []struct {
		now  int64
		want bool
	}{
		{at, true}, {at + w - 1, true}, {at + w, false}, {at - w + 1, true}, {at - w, false}, {0, false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, s.seen(s.slotFor(salt, h, tt.now)), "looked up at %v", time.Duration(tt.now-at))
	}
	s.record(s.slotFor(salt, h, at-w/2)) // an older date does not move the entry back
	assert.True(t, s.seen(s.slotFor(salt, h, at+w-1)))
	s.record(s.slotFor(salt, h, at+w/2))
	assert.True(t, s.seen(s.slotFor(salt, h, at+w)), "a newer date does")
	assert.False(t, s.seen(s.slotFor(salt, h, at-w/2)))

	// Dates start at 1 (0 marks an empty slot); the broker's messages are
	// published after the store was made, so none is dated before it.
	assert.Equal(t, int64(1), s.since(s.epoch.Add(-time.Hour)))
	assert.Equal(t, int64(1), s.since(s.epoch))
	assert.Equal(t, int64(5), s.since(s.epoch.Add(5)))
	assert.GreaterOrEqual(t, s.now(), int64(1))
}

// Records that replace entries while lookups read them never pair one key's
// tag with another key's date. Two goroutines record fresh keys into a
// table of eight slots (so nearly every record replaces an entry), one at
// date 1 and one a hundred windows later, and each looks its key up at the
// other's date: the key was recorded only at its own, so it must not be
// found there.
func TestMemoryIdempotencyStoreReplacementsNeverMixKeys(t *testing.T) {
	const window = time.Second
	s := NewMemoryIdempotencyStore(window, 8)
	dates := [2]int64{1, 100 * int64(window)}
	n := 200_000
	if raceEnabled {
		n = 100_000
	}
	var wrong atomic.Int64
	concurrently(2, func(g int) {
		for i := range n {
			h := placedKey(g<<32|i, 0)
			s.record(s.slotFor(dedupSalt{}, h, dates[g]))
			if s.seen(s.slotFor(dedupSalt{}, h, dates[1-g])) {
				wrong.Add(1)
			}
		}
	})
	assert.Zero(t, wrong.Load(), "lookups that found a key at a date it was never recorded at")
}

// placedKey is a hashed ID for key k that lands in the same buckets on
// every run (a store's own hashes are seeded at random).
func placedKey(k int, seed uint64) idHash {
	x := uint64(k+1)*0x9e3779b97f4a7c15 + seed
	return idHash{a: x ^ x>>29, b: x*0xbf58476d1ce4e5b9 ^ x>>31}
}

// concurrently runs f(0) to f(n-1) on goroutines of their own and waits for
// them.
func concurrently(n int, f func(g int)) {
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(g)
		}()
	}
	wg.Wait()
}

// Under concurrent records (fresh keys, repeats, dates moved back and
// forth) and lookups on small tables, a key is found only at a date within
// the window of a range it was recorded in, and afterwards the table is
// whole: no slot left busy, no filled slot after an empty one.
func TestMemoryIdempotencyStoreConcurrentInvariants(t *testing.T) {
	const window, groups = 1000, 5
	ops := 40_000
	if raceEnabled {
		ops = 10_000
	}
	base := func(k int) int64 { return 1 + int64(k%groups)*100*window } // k is recorded in [base, base+window/2)
	for _, tt := range []struct{ slots, keys int }{{8, 3}, {8, 12}, {16, 64}} {
		t.Run(fmt.Sprintf("%d slots, %d keys", tt.slots, tt.keys), func(t *testing.T) {
			s := NewMemoryIdempotencyStore(window, tt.slots)
			var wrong atomic.Int64
			concurrently(4, func(g int) {
				r := rand.New(rand.NewPCG(uint64(g), uint64(tt.keys)))
				for range ops {
					k := r.IntN(tt.keys)
					if r.IntN(2) == 0 {
						s.record(s.slotFor(dedupSalt{}, placedKey(k, 0), base(k)+r.Int64N(window/2)))
						continue
					}
					q := 1 + int64(r.IntN(groups))*100*window + r.Int64N(window/2)
					if s.seen(s.slotFor(dedupSalt{}, placedKey(k, 0), q)) && (q-base(k) >= window*3/2 || base(k)-q >= window) {
						wrong.Add(1)
					}
				}
			})
			assert.Zero(t, wrong.Load(), "keys found at dates outside the window of any date they were recorded at")
			buckets := s.table()
			for i := range buckets {
				empty := false
				for x := range buckets[i] {
					e := &buckets[i][x]
					tag, at := e.tag.Load(), e.at.Load()
					switch {
					case tag == 0:
						empty = true
						assert.Zero(t, at, "bucket %d slot %d: empty with a date", i, x)
					case tag == dedupBusy:
						t.Errorf("bucket %d slot %d left busy", i, x)
					default:
						assert.False(t, empty, "bucket %d slot %d filled after an empty one", i, x)
						assert.Positive(t, at, "bucket %d slot %d", i, x)
					}
				}
			}
		})
	}
}

// The default store is honest about its bound: under more traffic than it
// holds in a window, Stats count the IDs forgotten early and say the window
// it keeps now — and a copy published after that shorter window does run
// again, as they say.
func TestDedupStatsTellTheWindowKeptNow(t *testing.T) {
	bubble(t, func(t *testing.T) {
		store := NewMemoryIdempotencyStore(5*time.Minute, 1000)
		b := newTestBroker(t, WithIdempotencyStore(store))
		var got calls
		_, err := b.Subscribe("t", "s", okHandler(&got))
		require.NoError(t, err)
		st := b.Stats().Dedup
		assert.Equal(t, DedupStats{Capacity: 1000, Window: 5 * time.Minute, EffectiveWindow: 5 * time.Minute}, st)
		// 100 distinct IDs a second for 60 s: 6,000 IDs in a table of 1,000.
		for sec := range 60 {
			for i := range 100 {
				require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("id-", sec, "-", i), Topic: "t"}))
			}
			time.Sleep(time.Second)
		}
		settle(t, b)
		st = b.Stats().Dedup
		assert.Equal(t, 1000, st.Entries)
		assert.Equal(t, uint64(5000), st.ForgottenEarly, "6,000 IDs, 1,000 kept: each other one replaced inside the window (counted exactly in a small store)")
		assert.Less(t, st.EffectiveWindow, 20*time.Second, "the table holds about 10 s of this traffic, not 5 min")
		assert.Greater(t, st.EffectiveWindow, 2*time.Second)
		// A copy of an ID from 50 s ago runs again: it was forgotten early.
		require.NoError(t, b.Publish(context.Background(), Message{ID: "id-10-0", Topic: "t"}))
		// A copy of one from the last second is caught.
		require.NoError(t, b.Publish(context.Background(), Message{ID: "id-59-0", Topic: "t"}))
		settle(t, b)
		ss := subStats(t, b, "t", "s")
		assert.Equal(t, uint64(6001), ss.Delivered)
		assert.Equal(t, uint64(1), ss.Deduplicated)
	})
}

// An idle broker holds no dedup table: it is allocated at the first
// delivery that records an ID.
func TestDedupTableIsAllocatedOnFirstUse(t *testing.T) {
	before := heapInUse()
	store := NewMemoryIdempotencyStore(time.Minute, DefaultDedupEntries)
	assert.Less(t, heapInUse()-before, int64(64<<10), "a new store holds no table")
	seen, err := store.Seen(context.Background(), DeliveryKey{MessageID: "m"})
	require.NoError(t, err)
	assert.False(t, seen)
	assert.Nil(t, store.tab.Load(), "a lookup allocates nothing")
	require.NoError(t, store.Record(context.Background(), DeliveryKey{MessageID: "m"}))
	seen, _ = store.Seen(context.Background(), DeliveryKey{MessageID: "m"})
	assert.True(t, seen)
	assert.Equal(t, DefaultDedupEntries/dedupWays, len(*store.tab.Load()))
}

// TestDedupForgottenEarlyCounts: a small store counts every ID forgotten
// early; a large one (more than exactEntries) estimates the count from a
// sample of the replacements, within a few percent.
func TestDedupForgottenEarlyCounts(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		ids      int
		exact    bool
	}{
		{"small store, exact", 4096, 20_000, true},
		{"default size, sampled", DefaultDedupEntries, 250_001, false}, // 150,001 forgotten: not a multiple of the sample
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewMemoryIdempotencyStore(time.Hour, tc.capacity)
			now := time.Now()
			for i := range tc.ids {
				require.NoError(t, s.Record(context.Background(), DeliveryKey{Topic: "t", Subscriber: "s", MessageID: strconv.Itoa(i), PublishedAt: now}))
			}
			st := s.Stats()
			want := uint64(tc.ids - st.Entries) // every ID that did not fill a slot replaced one inside the window
			if tc.exact {
				assert.Equal(t, want, st.ForgottenEarly)
				return
			}
			assert.InEpsilon(t, float64(want), float64(st.ForgottenEarly), 0.05)
			assert.Zero(t, st.ForgottenEarly%replSample, "moves in steps of the sample")
		})
	}
}
