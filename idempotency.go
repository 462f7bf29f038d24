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

// dedupShards bounds lock contention: keys spread over this many shards.
const dedupShards = 16

// MemoryIdempotencyStore is the default IdempotencyStore: an in-memory
// window bounded both in time (an entry expires window after it was
// recorded) and in entries (when full, the oldest entry of the key's shard is
// forgotten first). It is sharded by message ID so concurrent subscribers
// rarely share a lock. It is safe for concurrent use.
type MemoryIdempotencyStore struct {
	window time.Duration
	seed   maphash.Seed
	shards []dedupShard
}

var _ IdempotencyStore = (*MemoryIdempotencyStore)(nil)

type dedupShard struct {
	mu    sync.Mutex                 // guards the fields below
	limit int                        // entries this shard keeps at most
	m     map[DeliveryKey]dedupEntry // live entries
	fifo  []dedupRecord              // record order, oldest at head; may hold stale records
	head  int                        // index of the oldest record in fifo
	seq   uint64                     // sequence of the last record
}

type dedupEntry struct {
	expires int64  // unix nanoseconds
	seq     uint64 // the record in fifo that owns this entry
}

type dedupRecord struct {
	key     DeliveryKey
	seq     uint64
	expires int64
}

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
	n := dedupShards
	for n > 1 && n > maxEntries {
		n /= 2
	}
	s := &MemoryIdempotencyStore{window: window, seed: maphash.MakeSeed(), shards: make([]dedupShard, n)}
	for i := range s.shards {
		s.shards[i].limit = maxEntries / n
		s.shards[i].m = make(map[DeliveryKey]dedupEntry)
	}
	return s
}

func (s *MemoryIdempotencyStore) shard(k *DeliveryKey) *dedupShard {
	return &s.shards[maphash.String(s.seed, k.MessageID)%uint64(len(s.shards))]
}

// Seen reports whether k was recorded within the window.
func (s *MemoryIdempotencyStore) Seen(_ context.Context, k DeliveryKey) (bool, error) {
	now := time.Now().UnixNano()
	sh := s.shard(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if ok && now >= e.expires {
		delete(sh.m, k)
		ok = false
	}
	return ok, nil
}

// Record remembers k for the window, forgetting expired entries and, when
// the shard is full, its oldest ones.
func (s *MemoryIdempotencyStore) Record(_ context.Context, k DeliveryKey) error {
	now := time.Now().UnixNano()
	sh := s.shard(&k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for sh.head < len(sh.fifo) && sh.fifo[sh.head].expires <= now {
		sh.popLocked()
	}
	sh.seq++
	expires := now + int64(s.window)
	sh.m[k] = dedupEntry{expires: expires, seq: sh.seq}
	sh.fifo = append(sh.fifo, dedupRecord{key: k, seq: sh.seq, expires: expires})
	for len(sh.m) > sh.limit {
		sh.popLocked()
	}
	return nil
}

// popLocked drops the oldest record, and its entry if the record still owns
// it (a key recorded again has a newer record).
func (sh *dedupShard) popLocked() {
	r := sh.fifo[sh.head]
	sh.fifo[sh.head] = dedupRecord{}
	sh.head++
	if e, ok := sh.m[r.key]; ok && e.seq == r.seq {
		delete(sh.m, r.key)
	}
	if sh.head > 1024 && sh.head*2 > len(sh.fifo) {
		n := copy(sh.fifo, sh.fifo[sh.head:])
		clear(sh.fifo[n:])
		sh.fifo = sh.fifo[:n]
		sh.head = 0
	}
}

// Len returns how many delivered IDs are remembered (expired ones that were
// not yet forgotten included).
func (s *MemoryIdempotencyStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
