package broker

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// Defaults of the in-memory idempotency store.
const (
	DefaultDedupWindow  = 5 * time.Minute // how long a delivered ID is remembered
	DefaultDedupEntries = 100_000         // how many delivered IDs are remembered at most
)

// DeliveryKey names one message at one subscriber: what the idempotency
// store remembers. Subscriber names are unique per topic, so Topic is part
// of the key.
type DeliveryKey struct {
	Topic, Subscriber, MessageID string
}

// IdempotencyStore remembers which message IDs each subscriber has already
// delivered. Implementations must be safe for concurrent use and may live
// outside this package (for example over Redis with SET NX and a TTL).
//
// The broker asks Seen before running a handler and calls Record only after
// the handler succeeded, so a failed delivery is never mistaken for a
// duplicate. When Seen fails the broker delivers anyway (a duplicate is
// within the at-least-once contract, a loss is not) and logs the error.
type IdempotencyStore interface {
	// Seen reports whether k was recorded and has not expired.
	Seen(ctx context.Context, k DeliveryKey) (bool, error)
	// Record remembers k as delivered.
	Record(ctx context.Context, k DeliveryKey) error
}

// MemoryIdempotencyStore is the default IdempotencyStore: an in-memory
// window bounded both in time (an entry is remembered for window after it
// was recorded; for the broker's own deliveries, after the delivery
// started) and in entries (a fixed table allocated once). It is safe for
// concurrent use.
//
// The table is set-associative with two choices: a key's hash picks two
// buckets of four entries (one cache line each); a lookup checks both, and a
// new entry takes an empty or expired slot of either, or else replaces the
// oldest of the eight. So a lookup touches two cache lines and allocates
// nothing, and the bound is exact. The price: an entry can be forgotten
// before its window ends when the table is nearly full — a duplicate then
// gets through, which at-least-once allows, while a message is never taken
// for a duplicate it is not. Keys are kept as 128-bit hashes of (topic,
// subscriber, message ID) with per-store random seeds: two distinct keys
// look alike with a probability of about 2^-125 per lookup.
type MemoryIdempotencyStore struct {
	window       time.Duration
	epoch        time.Time // monotonic base for expiry times
	seedA, seedB maphash.Seed
	buckets      []dedupBucket // split into one region per lock stripe
	locks        []paddedMutex // lock r guards region r (see region)
}

var _ IdempotencyStore = (*MemoryIdempotencyStore)(nil)

const (
	dedupWays    = 4  // entries per bucket: 4 × 16 bytes is one cache line
	dedupStripes = 64 // most lock stripes
)

// dedupBucket holds up to dedupWays entries; a zero tag is an empty slot.
type dedupBucket [dedupWays]struct {
	tag     uint64 // second hash of the key, never 0
	expires int64  // ns since the store's epoch
}

type paddedMutex struct {
	sync.Mutex
	_ [cacheLine - 8]byte
}

// NewMemoryIdempotencyStore returns a store remembering delivered IDs for
// window (DefaultDedupWindow if <= 0), at most maxEntries of them
// (DefaultDedupEntries if <= 0; rounded up to a multiple of four, and at
// least eight).
func NewMemoryIdempotencyStore(window time.Duration, maxEntries int) *MemoryIdempotencyStore {
	if window <= 0 {
		window = DefaultDedupWindow
	}
	if maxEntries <= 0 {
		maxEntries = DefaultDedupEntries
	}
	buckets := max((maxEntries+dedupWays-1)/dedupWays, 2)
	return &MemoryIdempotencyStore{
		window: window, epoch: time.Now(),
		seedA: maphash.MakeSeed(), seedB: maphash.MakeSeed(),
		buckets: make([]dedupBucket, buckets),
		locks:   make([]paddedMutex, min(dedupStripes, buckets/2)), // regions of 2 buckets or more
	}
}

// region returns the first bucket of lock stripe r's region and its size.
func (s *MemoryIdempotencyStore) region(r int) (start, size int) {
	n, k := len(s.buckets), len(s.locks)
	start = r * n / k
	return start, (r+1)*n/k - start
}

// slot is where a key may live — a lock stripe, two distinct buckets of its
// region, and its tag — and the time it was looked up, which both the
// lookup and a later record use: one clock read per delivery.
type slot struct {
	stripe, i, j int
	tag          uint64
	now          int64 // ns since the store's epoch
}

// dedupSalt is the hash of a (topic, subscriber) pair; a key's slot is
// derived from it and the hash of the message ID, so a subscriber computes
// its salt once and hashes only the ID per message.
type dedupSalt struct{ a, b uint64 }

func (s *MemoryIdempotencyStore) salt(topic, subscriber string) dedupSalt {
	k := [2]string{topic, subscriber}
	return dedupSalt{maphash.Comparable(s.seedA, k), maphash.Comparable(s.seedB, k)}
}

func (s *MemoryIdempotencyStore) slotOf(salt dedupSalt, id string) slot {
	a := maphash.String(s.seedA, id) ^ salt.a
	// Both buckets lie in one stripe's region, so one lock covers them.
	stripe := a % uint64(len(s.locks))
	a /= uint64(len(s.locks))
	start, size := s.region(int(stripe))
	r := uint64(size)
	i := a % r
	j := (a / r) % (r - 1) // a second bucket, different from i
	if j >= i {
		j++
	}
	return slot{
		stripe: int(stripe), i: start + int(i), j: start + int(j),
		tag: (maphash.String(s.seedB, id) ^ salt.b) | 1, now: s.now(),
	}
}

func (s *MemoryIdempotencyStore) locate(k *DeliveryKey) slot {
	return s.slotOf(s.salt(k.Topic, k.Subscriber), k.MessageID)
}

// now is the time since the store's epoch, from the monotonic clock.
func (s *MemoryIdempotencyStore) now() int64 { return int64(time.Since(s.epoch)) }

// Seen reports whether k was recorded within the window.
func (s *MemoryIdempotencyStore) Seen(_ context.Context, k DeliveryKey) (bool, error) {
	return s.seen(s.locate(&k)), nil
}

// Record remembers k for the window.
func (s *MemoryIdempotencyStore) Record(_ context.Context, k DeliveryKey) error {
	s.record(s.locate(&k))
	return nil
}

func (s *MemoryIdempotencyStore) seen(sl slot) bool {
	now := sl.now
	mu := &s.locks[sl.stripe]
	mu.Lock()
	defer mu.Unlock()
	for _, bi := range [2]int{sl.i, sl.j} {
		for _, e := range &s.buckets[bi] {
			if e.tag == sl.tag {
				return now < e.expires
			}
		}
	}
	return false
}

// record puts the key of sl in place of its own entry if it has one, else
// in a free (empty or expired) slot of the emptier of its two buckets, else
// in place of the entry of the two that expires first.
func (s *MemoryIdempotencyStore) record(sl slot) {
	now := sl.now
	expires := now + int64(s.window)
	mu := &s.locks[sl.stripe]
	mu.Lock()
	defer mu.Unlock()
	bi, bj := &s.buckets[sl.i], &s.buckets[sl.j]
	var free [2]int
	var firstFree [2]int
	oldest := &bi[0]
	for n, b := range [2]*dedupBucket{bi, bj} {
		for x := range b {
			e := &b[x]
			if e.tag == sl.tag {
				e.expires = expires
				return
			}
			if e.expires <= now { // empty (0) or expired
				if free[n] == 0 {
					firstFree[n] = x
				}
				free[n]++
			}
			if e.expires < oldest.expires {
				oldest = e
			}
		}
	}
	switch {
	case free[0] >= free[1] && free[0] > 0:
		oldest = &bi[firstFree[0]]
	case free[1] > 0:
		oldest = &bj[firstFree[1]]
	}
	oldest.tag, oldest.expires = sl.tag, expires
}

// Len returns how many delivered IDs are remembered and not expired.
func (s *MemoryIdempotencyStore) Len() int {
	now, n := s.now(), 0
	for r := range s.locks {
		start, size := s.region(r)
		s.locks[r].Lock()
		for i := start; i < start+size; i++ {
			for _, e := range &s.buckets[i] {
				if e.tag != 0 && now < e.expires {
					n++
				}
			}
		}
		s.locks[r].Unlock()
	}
	return n
}

// Cap returns the most IDs the store remembers.
func (s *MemoryIdempotencyStore) Cap() int { return len(s.buckets) * dedupWays }
