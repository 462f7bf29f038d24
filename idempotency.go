package broker

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/inproc/broker/internal/prefetch"
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
// Their context is the one DeadLetterStore.Put gets: never cancelled while
// the subscriber runs, it ends soon after a Close's or Unsubscribe's
// context does, and a call waiting for a backend must return then.
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

// How the table works: it is set-associative with two choices: a key's
// hash picks two buckets of four entries (one cache line each); a lookup
// checks both, and a new entry takes an empty slot of the emptier bucket,
// or else replaces the oldest of the eight. So a lookup touches two cache
// lines and allocates nothing, and the bound is exact. Entries are read
// and written with atomic operations. A tag is 63 bits of the key's hash,
// so a lookup comparing eight entries mistakes a key for another with a
// probability of about 2^-60.
//
// Why not a plain map under a mutex: that version (64 shards of a map with
// a ring each, keys as 128-bit hashes) was much slower end to end, from
// the extra cache misses of the map's lookup, insert and eviction and from
// workers of different subscribers meeting on the shard locks; the
// measurements are in CONTRIBUTING.md ("Clever parts and the simplicity
// rule").

// MemoryIdempotencyStore is the default IdempotencyStore: an in-memory
// window bounded both in time and in entries (a fixed table, allocated at
// the first Record). It is safe for concurrent use and takes no lock.
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
// dated by the clock at the call. An ID delivered again more than the
// window from its earlier delivery keeps both dates, its earliest and its
// latest (two entries of the bound): a retry of a copy older than both is
// still caught, and only dates between them can be forgotten.
//
// The bound is exact, and a lookup allocates nothing. The price: an entry
// can be forgotten before its window ends when the table is nearly full
// (the entries of a subscriber that is behind by more than the window go
// first), or when two records race for one slot. A duplicate then gets
// through, which at-least-once allows; Stats count it
// (DedupStats.ForgottenEarly). A message is never taken for a duplicate it
// is not, but for a chance of about 2^-60 per lookup (keys are hashed with
// per-store random seeds).
//
// That promise assumes a key is not recorded while it is being looked
// up, which the broker never does (two deliveries of one ID to one
// subscriber never run at once). A caller of Seen and Record that does both
// for one key at once could, if the lookup stalls while the entry is
// replaced and the key then recorded into it again, be told the key was
// seen at the other key's date.
type MemoryIdempotencyStore struct {
	window       time.Duration
	epoch        time.Time // monotonic base for dates
	seedA, seedB maphash.Seed
	nBuckets     int
	// tab is the table, allocated at the first Record (an idle broker
	// holds none of its 1.6 MB); nil before.
	tab     atomic.Pointer[[]dedupBucket]
	tabOnce sync.Once

	// What the bound costs, for Stats: entries never leave the table, so
	// filled is how many slots hold one; an entry replaced while still
	// inside the window was forgotten early, and the age at which entries
	// are replaced is the window the table keeps now. In a large table
	// (the default's 100,000 entries) replacements are counted on a
	// sample, one in replSample chosen by the key's hash: two atomic
	// writes on every replacement made W2 (8 subscribers, a full table) 30%
	// slower (bench/ab.sh, 10 rounds, against no counting).
	filled      atomic.Int64
	forgotten   atomic.Uint64 // replacements inside the window (sampled ones times sample)
	sample      uint64        // 1: every replacement counted; else one in sample (see replSample), a power of two
	replacedAge atomic.Int64  // -1 until an entry is replaced
}

// A table larger than exactEntries counts replacements on a sample: one
// in replSample, chosen by the key's hash. A smaller one counts each (its
// traffic is small, or it fits in cache).
const (
	replSample   = 16 // a power of two
	exactEntries = 1 << 16
)

var _ IdempotencyStore = (*MemoryIdempotencyStore)(nil)

// dedupWays is the entries per bucket: 4 × 16 bytes is one cache line.
const dedupWays = 4

// dedupBucket holds up to dedupWays entries.
type dedupBucket [dedupWays]dedupEntry

// dedupEntry is one slot: a key's tag and its date, two words that are
// written together only while the tag is dedupBusy. A writer claims the slot
// by swapping the tag it saw for dedupBusy (and gives up if the swap fails:
// another writer got there first), writes the date, then the new tag. A
// reader that found a tag reads the date, then the tag again: if the tag is
// still the one it found, the date is that key's, not the next occupant's.
type dedupEntry struct {
	tag atomic.Uint64 // 0: empty; dedupBusy: being written; else a key's tag (odd)
	at  atomic.Int64  // the entry's date (see since); 0 in an empty slot
}

// dedupBusy is the tag of a slot being written; keys' tags are odd.
const dedupBusy = 2

// claim makes e the caller's to write, if its tag is still seen (and no
// other writer holds it).
func (e *dedupEntry) claim(seen uint64) bool {
	return seen != dedupBusy && e.tag.CompareAndSwap(seen, dedupBusy)
}

// set writes a claimed entry: the date, then the tag, which releases it.
func (e *dedupEntry) set(tag uint64, at int64) {
	e.at.Store(at)
	e.tag.Store(tag)
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
	s := &MemoryIdempotencyStore{
		window: window, epoch: time.Now().Add(-1), // a date is at least 1
		seedA: maphash.MakeSeed(), seedB: maphash.MakeSeed(),
		nBuckets: max((maxEntries+dedupWays-1)/dedupWays, 2),
	}
	s.replacedAge.Store(-1)
	s.sample = 1
	if s.Cap() > exactEntries {
		s.sample = replSample
	}
	return s
}

// slot is where a key may live — two distinct buckets, and its tag — and
// the time that dates it: its message's publication, or a Seen or Record
// call.
type slot struct {
	i, j int
	tag  uint64
	now  int64 // ns since the store's epoch
}

// dedupSalt is the hash of a (topic, subscriber) pair; a key's slot is
// derived from it and the hash of the message ID, so a subscriber computes
// its salt once and hashes only the ID per message.
type dedupSalt struct{ a, b uint64 }

func (s *MemoryIdempotencyStore) salt(topic, subscriber string) dedupSalt {
	k := [2]string{topic, subscriber}
	return dedupSalt{maphash.Comparable(s.seedA, k), maphash.Comparable(s.seedB, k)}
}

// idHash is a message ID hashed with the store's two seeds; the broker
// computes it once per message and derives every subscriber's slot from it.
// The zero value means "not computed" (a real hash is zero with probability
// 2^-128, which costs only a second computation).
type idHash struct{ a, b uint64 }

func (s *MemoryIdempotencyStore) hashID(id string) idHash {
	return idHash{a: maphash.String(s.seedA, id), b: maphash.String(s.seedB, id)}
}

// slotFor places a hashed ID of the subscriber with the given salt, dated
// now (ns since the epoch, from since or now). Bucket indexes come from
// multiplying 32-bit halves of the hash by the range (no division).
func (s *MemoryIdempotencyStore) slotFor(salt dedupSalt, h idHash, now int64) slot {
	a := h.a ^ salt.a
	n := uint64(s.nBuckets)
	i := (a >> 32) * n >> 32
	j := (a & 0xffffffff) * (n - 1) >> 32 // a second bucket, different from i
	if j >= i {
		j++
	}
	return slot{i: int(i), j: int(j), tag: (h.b ^ salt.b) | 1, now: now}
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

// since is t as a date: ns since the store's epoch, at least 1 (0 marks an
// empty slot). It reads no clock: it uses t's monotonic reading, which
// PublishedAt carries, else its wall clock.
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
	tab := s.tab.Load()
	if tab == nil {
		return false // nothing recorded yet
	}
	return (*tab)[sl.i].find(s, sl) || (*tab)[sl.j].find(s, sl)
}

// find reports whether b has an entry of the key of sl (a key has one or
// two, see record) dated within the window of sl.now. An entry that is
// replaced while find reads it counts as not found.
func (b *dedupBucket) find(s *MemoryIdempotencyStore, sl slot) bool {
	for x := range b {
		e := &b[x]
		if e.tag.Load() == sl.tag {
			at := e.at.Load()
			if e.tag.Load() == sl.tag && s.within(sl.now, at) {
				return true
			}
		}
	}
	return false
}

// within reports whether two dates are less than the window apart.
func (s *MemoryIdempotencyStore) within(now, at int64) bool {
	d := now - at // both are at least 0: no overflow
	return d < int64(s.window) && -d < int64(s.window)
}

// record remembers the key of sl, dated sl.now: in its own entry if it has
// one dated within the window (which keeps the later date), else in an
// empty slot of the emptier of its two buckets, else in place of the oldest
// other entry of the two. So a key delivered twice more than the window
// apart has two entries, its earliest and its latest date (a third date
// moves the one it is beyond): a copy published near either is still a
// duplicate, as the window promises. (With one date moved forward, a retry
// of an older copy ran again once a newer copy was delivered.)
//
// A bucket fills from its first slot (entries are replaced, never
// removed), so its first empty slot — the oldest, dated 0 — is also how
// many entries it holds.
//
// When another writer changes the chosen slot first, the key goes
// unremembered: a duplicate may then get through, which at-least-once
// allows.
func (s *MemoryIdempotencyStore) record(sl slot) {
	tab := s.table()
	b0, b1 := &tab[sl.i], &tab[sl.j]
	var own ownEntries
	old0, x0, tag0 := b0.scan(sl.tag, &own)
	old1, x1, tag1 := b1.scan(sl.tag, &own)
	switch own.n {
	case 1:
		if e, d := own.e[0], own.d[0]; s.within(sl.now, d) {
			if d < sl.now && e.claim(sl.tag) {
				e.set(sl.tag, max(sl.now, e.at.Load()))
			}
			return
		}
		// More than the window from its date: a second entry, below.
	case 2:
		lo, hi := 0, 1
		if own.d[1] < own.d[0] {
			lo, hi = 1, 0
		}
		if e := own.e[hi]; sl.now > own.d[hi] && e.claim(sl.tag) {
			e.set(sl.tag, max(sl.now, e.at.Load()))
		} else if e := own.e[lo]; sl.now < own.d[lo] && e.claim(sl.tag) {
			e.set(sl.tag, min(sl.now, e.at.Load()))
		}
		return
	}
	victim, seen, dated := &b0[x0], tag0, old0
	if old1 < old0 || old1 == 0 && old0 == 0 && x1 < x0 {
		victim, seen, dated = &b1[x1], tag1, old1
	}
	if victim.claim(seen) {
		victim.set(sl.tag, sl.now)
		if seen == 0 {
			s.filled.Add(1)
			return
		}
		if (sl.tag>>1)&(s.sample-1) != 0 { // the tag's low bit is always 1
			return // not in the sample
		}
		// The window kept now: a moving average of the ages replaced (a
		// lost update between two writers only delays it).
		age := max(sl.now-dated, 0)
		if avg := s.replacedAge.Load(); avg >= 0 {
			age = avg + (age-avg)/64
		}
		s.replacedAge.Store(age)
		if s.within(sl.now, dated) {
			s.forgotten.Add(s.sample)
		}
	}
}

// DedupStats says what the default store's bound costs (Stats.Dedup).
type DedupStats struct {
	Capacity int           // most IDs remembered, all subscribers together
	Entries  int           // IDs remembered now (in the window or not)
	Window   time.Duration // the configured window
	// ForgottenEarly counts IDs dropped to make room while still inside
	// the window: a copy of one published later, within the window, runs
	// again. Nonzero means the table is too small for the traffic. It is
	// exact for a store of at most 65,536 entries; a larger one (the
	// default holds 100,000) estimates it from one replacement in 16
	// (chosen by the ID's hash), so it moves in steps of 16 and is within a
	// few percent once a few hundred were forgotten.
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

// ownEntries are the entries of one key found by scan: at most two.
type ownEntries struct {
	e [2]*dedupEntry
	d [2]int64 // their dates
	n int
}

// scan adds the entries of b with tag to own, and returns the oldest date
// of b's other entries, where it is (b's first empty slot, when it has
// one) and the tag seen there.
func (b *dedupBucket) scan(tag uint64, own *ownEntries) (oldest int64, at int, seen uint64) {
	oldest = math.MaxInt64
	for x := range b {
		e := &b[x]
		t := e.tag.Load()
		d := e.at.Load()
		if t == tag {
			if own.n < len(own.e) {
				own.e[own.n], own.d[own.n] = e, d
				own.n++
			}
			continue
		}
		if d < oldest {
			oldest, at, seen = d, x, t
		}
	}
	return oldest, at, seen
}

// Len returns how many entries are dated less than the window before or
// after now. The entries of a subscriber behind by more than the window are
// not counted, though they still match copies published with them.
func (s *MemoryIdempotencyStore) Len() int {
	now, n := s.now(), 0
	tab := s.tab.Load()
	if tab == nil {
		return 0
	}
	for i := range *tab {
		for x := range (*tab)[i] {
			e := &(*tab)[i][x]
			if t := e.tag.Load(); t != 0 && t != dedupBusy && s.within(now, e.at.Load()) {
				n++
			}
		}
	}
	return n
}

// Cap returns the most IDs the store remembers.
func (s *MemoryIdempotencyStore) Cap() int { return s.nBuckets * dedupWays }

// table returns the table, allocating it at the first call.
func (s *MemoryIdempotencyStore) table() []dedupBucket {
	if tab := s.tab.Load(); tab != nil {
		return *tab
	}
	s.tabOnce.Do(func() {
		tab := make([]dedupBucket, s.nBuckets)
		s.tab.Store(&tab)
	})
	return *s.tab.Load()
}

// prefetch asks for both buckets a hashed ID can live in to be brought
// into cache, without waiting: a worker issues it for the message two
// ahead of the one it delivers, so the lookup later finds them there. A
// clever part that pays its way: W2 (eight workers looking up the 1.6 MB
// table per message) is 11% and 15% faster with it (bench/ab.sh, 10 and
// 12 alternating rounds, p=0.015); W1 and W3 do not change measurably.
func (s *MemoryIdempotencyStore) prefetch(salt dedupSalt, h idHash) {
	tab := s.tab.Load()
	if tab == nil {
		return
	}
	sl := s.slotFor(salt, h, 0)
	prefetch.Line(unsafe.Pointer(&(*tab)[sl.i]))
	prefetch.Line(unsafe.Pointer(&(*tab)[sl.j]))
}
