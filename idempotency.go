package broker

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of the in-memory idempotency store.
const (
	DefaultDedupWindow  = 5 * time.Minute // how far apart in publish time two copies of an ID are duplicates
	DefaultDedupEntries = 100_000         // how many delivered IDs are remembered at most
)

// DeliveryKey names one message at one subscriber: what the idempotency
// store remembers. Subscriber names are unique per topic, so Topic is part
// of the key.
type DeliveryKey struct {
	Topic, Subscriber, MessageID string
	// PublishedAt is when the message was published (for a redriven dead
	// letter: when its redelivery started), so that a store can measure its
	// window in publish time as the default store does; a store that dates
	// entries by Record's clock may ignore it.
	PublishedAt time.Time
}

// IdempotencyStore remembers which message IDs each subscriber has already
// delivered. Implementations must be safe for concurrent use and may live
// outside this package (for example over Redis with SET NX and a TTL).
//
// The broker asks Seen before running a handler and calls Record only after
// the handler succeeded, so a failed delivery is never mistaken for a
// duplicate. When Seen fails the broker delivers anyway (a duplicate is
// within the at-least-once contract, a loss is not) and logs the error.
//
// The store decides what its window means: a store with a TTL remembers a
// key for the TTL from Record, the end of a delivery. The default,
// MemoryIdempotencyStore, measures its window in publish time instead.
type IdempotencyStore interface {
	// Seen reports whether k was recorded and has not expired.
	Seen(ctx context.Context, k DeliveryKey) (bool, error)
	// Record remembers k as delivered.
	Record(ctx context.Context, k DeliveryKey) error
}

// MemoryIdempotencyStore is the default IdempotencyStore: an in-memory
// window bounded both in time and in entries. It is safe for concurrent use.
//
// The window is measured in publish time when the broker uses the store, as
// SQS FIFO queues and the JetStream duplicate window do: a message is a
// duplicate at a subscriber when a message with its ID, published less than
// window before or after it, was delivered there first. A backlog or a long
// retry does not change which messages count as duplicates, and the worker
// reads no clock for it: both times come from the messages' PublishedAt. A
// redriven dead letter counts as published again when its redelivery starts
// (it is dated by a clock read then). Through Seen and Record the window is
// the same, in DeliveryKey.PublishedAt (the broker sets it), so a store that
// wraps this one behaves exactly like it; a key without PublishedAt is
// dated by the clock at the call.
//
// It is a map under a mutex, split into shards by the key's hash so that
// subscribers seldom wait for each other, with a ring per shard that
// remembers the order keys came in: when a shard is full, the key recorded
// first gives way. Keys are kept as 128-bit hashes of (topic, subscriber,
// ID) with per-store random seeds, so an entry has a fixed size whatever
// the ID's length, and two keys are confused with a probability of about
// 2^-128. An entry forgotten to make room while still inside the window
// lets a duplicate through, which at-least-once allows, and is counted
// (Stats); a message is never taken for a duplicate it is not.
type MemoryIdempotencyStore struct {
	window       time.Duration
	epoch        time.Time // monotonic base for dates
	seedA, seedB maphash.Seed
	capacity     int
	shards       []dedupShard

	// What the bound costs, for Stats: how many entries are held; an
	// entry replaced while still inside the window was forgotten early,
	// and the age of the entries replaced is the window the store keeps
	// now.
	filled      atomic.Int64
	forgotten   atomic.Uint64
	replacedAge atomic.Int64 // -1 until an entry is replaced
}

var _ IdempotencyStore = (*MemoryIdempotencyStore)(nil)

// dedupKey is a delivery key hashed with the store's two seeds.
type dedupKey struct{ a, b uint64 }

// dedupShard is a part of the store: a map from key to date, and the keys
// in the order they came in. Its map and ring grow as entries come, up to
// its capacity: an idle broker holds none of a full store's few MB.
type dedupShard struct {
	mu       sync.Mutex
	at       map[dedupKey]int64 // a key's date (see since)
	order    []dedupKey         // keys, oldest first from next once full
	next     int                // where the next key goes once order is full
	capacity int
}

// maxDedupShards bounds the shards; a shard holds at least minShardEntries
// keys, so that a small store keeps its oldest-first order.
const (
	maxDedupShards  = 64
	minShardEntries = 256
)

// NewMemoryIdempotencyStore returns a store remembering delivered IDs for
// window (DefaultDedupWindow if <= 0), at most maxEntries of them
// (DefaultDedupEntries if <= 0).
func NewMemoryIdempotencyStore(window time.Duration, maxEntries int) *MemoryIdempotencyStore {
	if window <= 0 {
		window = DefaultDedupWindow
	}
	if maxEntries <= 0 {
		maxEntries = DefaultDedupEntries
	}
	n := 1
	for n < maxDedupShards && maxEntries/(n*2) >= minShardEntries {
		n *= 2
	}
	s := &MemoryIdempotencyStore{
		window: window, epoch: time.Now().Add(-1), // a date is at least 1
		seedA: maphash.MakeSeed(), seedB: maphash.MakeSeed(),
		capacity: maxEntries, shards: make([]dedupShard, n),
	}
	for i := range s.shards { // the first maxEntries%n shards hold one more
		s.shards[i].capacity = maxEntries / n
		if i < maxEntries%n {
			s.shards[i].capacity++
		}
	}
	s.replacedAge.Store(-1)
	return s
}

// slot is a key and the time that dates it: its message's publication, or
// a Seen or Record call.
type slot struct {
	key dedupKey
	now int64 // ns since the store's epoch
}

// dedupSalt is the hash of a (topic, subscriber) pair; a key is derived
// from it and the hash of the message ID, so a subscriber computes its salt
// once and hashes only the ID per message.
type dedupSalt struct{ a, b uint64 }

func (s *MemoryIdempotencyStore) salt(topic, subscriber string) dedupSalt {
	k := [2]string{topic, subscriber}
	return dedupSalt{maphash.Comparable(s.seedA, k), maphash.Comparable(s.seedB, k)}
}

// idHash is a message ID hashed with the store's two seeds; the broker
// computes it once per message and derives every subscriber's key from it.
// The zero value means "not computed" (a real hash is zero with probability
// 2^-128, which costs only a second computation).
type idHash struct{ a, b uint64 }

func (s *MemoryIdempotencyStore) hashID(id string) idHash {
	return idHash{a: maphash.String(s.seedA, id), b: maphash.String(s.seedB, id)}
}

// slotFor is the key of a hashed ID at the subscriber with the given salt,
// dated now (ns since the epoch, from since or now).
func (s *MemoryIdempotencyStore) slotFor(salt dedupSalt, h idHash, now int64) slot {
	return slot{key: dedupKey{a: h.a ^ salt.a, b: h.b ^ salt.b}, now: now}
}

// shard returns the shard of k: the top bits of its hash pick it, as the
// map uses the low ones.
func (s *MemoryIdempotencyStore) shard(k dedupKey) *dedupShard {
	return &s.shards[(k.a>>32)*uint64(len(s.shards))>>32]
}

// locate places k, dated by its PublishedAt, or by a clock read without
// one.
func (s *MemoryIdempotencyStore) locate(k *DeliveryKey) slot {
	at := s.now()
	if !k.PublishedAt.IsZero() {
		at = s.since(k.PublishedAt)
	}
	return s.slotFor(s.salt(k.Topic, k.Subscriber), s.hashID(k.MessageID), at)
}

// now is the time since the store's epoch, from the monotonic clock, as a
// date (see since).
func (s *MemoryIdempotencyStore) now() int64 { return int64(time.Since(s.epoch)) }

// since is t as a date: ns since the store's epoch, at least 1. It reads no
// clock: it uses t's monotonic reading, which PublishedAt carries, else its
// wall clock.
func (s *MemoryIdempotencyStore) since(t time.Time) int64 { return max(int64(t.Sub(s.epoch)), 1) }

// Seen reports whether k was recorded less than the window ago.
func (s *MemoryIdempotencyStore) Seen(_ context.Context, k DeliveryKey) (bool, error) {
	return s.seen(s.locate(&k)), nil
}

// Record remembers k for the window, from now.
func (s *MemoryIdempotencyStore) Record(_ context.Context, k DeliveryKey) error {
	s.record(s.locate(&k))
	return nil
}

func (s *MemoryIdempotencyStore) seen(sl slot) bool {
	sh := s.shard(sl.key)
	sh.mu.Lock()
	at, ok := sh.at[sl.key]
	sh.mu.Unlock()
	return ok && s.within(sl.now, at)
}

// within reports whether two dates are less than the window apart.
func (s *MemoryIdempotencyStore) within(now, at int64) bool {
	d := now - at // both are at least 0: no overflow
	return d < int64(s.window) && -d < int64(s.window)
}

// record remembers the key of sl, dated sl.now (a key recorded again keeps
// the later date). In a full shard it replaces the key that came in first.
func (s *MemoryIdempotencyStore) record(sl slot) {
	sh := s.shard(sl.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if at, ok := sh.at[sl.key]; ok {
		sh.at[sl.key] = max(at, sl.now)
		return
	}
	if sh.at == nil {
		sh.at = make(map[dedupKey]int64)
	}
	sh.at[sl.key] = sl.now
	if len(sh.order) < sh.capacity {
		sh.order = append(sh.order, sl.key)
		s.filled.Add(1)
		return
	}
	old := sh.order[sh.next]
	dated := sh.at[old]
	delete(sh.at, old)
	sh.order[sh.next] = sl.key
	sh.next = (sh.next + 1) % len(sh.order)
	// The window kept now: a moving average of the ages replaced.
	age := max(sl.now-dated, 0)
	if avg := s.replacedAge.Load(); avg >= 0 {
		age = avg + (age-avg)/64
	}
	s.replacedAge.Store(age)
	if s.within(sl.now, dated) {
		s.forgotten.Add(1)
	}
}

// DedupStats says what the default store's bound costs (Stats.Dedup).
type DedupStats struct {
	Capacity int           // most IDs remembered, all subscribers together
	Entries  int           // IDs remembered now (in the window or not)
	Window   time.Duration // the configured window
	// ForgottenEarly counts IDs dropped to make room while still inside
	// the window: a copy of one published later, within the window, runs
	// again. Nonzero means the store is too small for the traffic.
	ForgottenEarly uint64
	// EffectiveWindow is how far apart in publish time an ID and its copy
	// are still caught now: the age at which entries are replaced to make
	// room (a moving average over the last few dozen), or Window if that is
	// longer or nothing was replaced yet.
	EffectiveWindow time.Duration
}

// Stats reports the store's use of its bound.
func (s *MemoryIdempotencyStore) Stats() DedupStats {
	st := DedupStats{
		Capacity: s.Cap(), Entries: int(s.filled.Load()), Window: s.window,
		ForgottenEarly: s.forgotten.Load(), EffectiveWindow: s.window,
	}
	if age := s.replacedAge.Load(); age >= 0 && time.Duration(age) < s.window {
		st.EffectiveWindow = time.Duration(age)
	}
	return st
}

// Len returns how many entries are dated less than the window before or
// after now. The entries of a subscriber behind by more than the window are
// not counted, though they still match copies published with them.
func (s *MemoryIdempotencyStore) Len() int {
	now, n := s.now(), 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, at := range sh.at {
			if s.within(now, at) {
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// Cap returns the most IDs the store remembers.
func (s *MemoryIdempotencyStore) Cap() int { return s.capacity }
