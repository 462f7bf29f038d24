package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inproc/broker/internal/fifo"
)

// Reasons a message was dead-lettered (DeadLetter.Reason).
const (
	ReasonExhausted    = "exhausted"    // every allowed attempt failed with a retryable error
	ReasonPermanent    = "permanent"    // the error was not retryable under the policy
	ReasonShutdown     = "shutdown"     // Close's context ended before the message was finished
	ReasonUnsubscribed = "unsubscribed" // Unsubscribe's context ended before the message was finished
	ReasonOverflow     = "overflow"     // the subscriber's lane was full and its policy sheds (WhenLaneFull)
	ReasonBudget       = "budget"       // a retryable failure when the subscriber's retry budget was spent (RetryBudget)
)

// DefaultDeadLetterCapacity is how many dead letters the default in-memory
// store keeps before it evicts the oldest.
const DefaultDeadLetterCapacity = 10_000

// DeadLetter is a message that failed at one subscriber, with everything
// needed to diagnose and redrive it.
type DeadLetter struct {
	// ID identifies this dead letter; one message can fail at several
	// subscribers and so have several dead letters.
	ID string
	// Message is the message as last delivered: Message.Attempt is the last
	// attempt (0 if it was never attempted).
	Message Message
	// Subscriber is the name of the subscriber that failed it, on
	// Message.Topic.
	Subscriber string
	// Attempts is how many attempts were made in the dispatch that failed.
	Attempts int
	// ErrorCode is the code of the last error (see the Code constants).
	ErrorCode string
	// Error is the text of the last error.
	Error string
	// Retryable reports whether the policy allowed retries for the last
	// error's code: false for a Permanent error or a code whose ByCode rule
	// has NoRetries; true under a policy-wide NoRetries (its dead letter is
	// exhausted, not permanent).
	Retryable bool
	// Reason is one of ReasonExhausted, ReasonPermanent, ReasonShutdown,
	// ReasonUnsubscribed, ReasonOverflow, ReasonBudget.
	Reason string
	// FailedAt is when the message was dead-lettered.
	FailedAt time.Time
}

// DeadLetterFilter selects dead letters in List and RedriveMatching. Each
// field set must match exactly; empty fields match everything; Limit 0
// means no limit.
type DeadLetterFilter struct {
	Topic, Subscriber, ErrorCode string
	// Reason is one of the Reason constants (ReasonOverflow: what a
	// shedding subscriber dropped).
	Reason string
	Limit  int
}

// Match reports whether dl satisfies the filter's Topic, Subscriber,
// ErrorCode and Reason (Limit is the store's business).
func (f DeadLetterFilter) Match(dl DeadLetter) bool {
	return (f.Topic == "" || f.Topic == dl.Message.Topic) &&
		(f.Subscriber == "" || f.Subscriber == dl.Subscriber) &&
		(f.ErrorCode == "" || f.ErrorCode == dl.ErrorCode) &&
		(f.Reason == "" || f.Reason == dl.Reason)
}

// Validate reports a malformed filter (a negative Limit), wrapping
// ErrInvalidOption.
func (f DeadLetterFilter) Validate() error {
	if f.Limit < 0 {
		return fmt.Errorf("%w: dead-letter filter Limit %d < 0", ErrInvalidOption, f.Limit)
	}
	return nil
}

// DeadLetterStore keeps dead letters. Implementations must be safe for
// concurrent use; they may live outside this package (a database, Redis).
// The broker calls Put from delivery goroutines, so a slow Put slows that
// subscriber. Put's context is never cancelled while the subscriber runs;
// once a Close or Unsubscribe context ends, it ends 2×ShutdownGrace later
// (one grace after the stop's deadline), its cause matching ErrClosed or
// ErrUnsubscribed. A Put that waits for a backend must return when its
// context ends: that is what lets Close and Unsubscribe return soon after
// their context ends. A Put that fails is retried with backoff while the
// broker runs (holding the message's key and the worker that ran it: with
// Concurrency 1 the subscriber waits for the store), unless its error wraps
// ErrDeadLetterRefused; at a stop's deadline it is given up, logged with
// every field and counted in DrainError.Lost.
type DeadLetterStore interface {
	// Put stores dl; a dl with an ID already stored replaces it.
	Put(ctx context.Context, dl DeadLetter) error
	// List returns the dead letters matching f, oldest first, at most
	// f.Limit of them when f.Limit > 0.
	List(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
	// Get returns the dead letter with the given ID, and whether it exists.
	Get(ctx context.Context, id string) (DeadLetter, bool, error)
	// Delete removes the dead letters with the given IDs; unknown IDs are
	// ignored.
	Delete(ctx context.Context, ids ...string) error
	// Len returns how many dead letters are stored.
	Len(ctx context.Context) (int, error)
}

// How it is kept: dead letters sit in a ring in the order they were put,
// with an index by ID; Delete leaves a hole that is dropped when it
// reaches the front, or when holes outnumber the dead letters. So a Put
// allocates nothing in the steady state, which matters to a subscriber
// that sheds every message (its shedder puts a dead letter per message).

// MemoryDeadLetterStore is the default DeadLetterStore: bounded, in memory,
// oldest first. When full, Put evicts the oldest dead letter, logs it at
// Warn level (10 lines a second, then one summary line a second with the
// count) and counts it (Evicted). It is safe for concurrent use, and a
// Put allocates nothing in the steady state.
type MemoryDeadLetterStore struct {
	capacity int
	logger   *slog.Logger
	evictLog *logLimit // rate-limits the eviction lines
	evicted  atomic.Uint64

	mu    sync.Mutex        // guards the fields below
	ring  fifo.Ring[dlSlot] // in Put order, holes included
	first uint64            // sequence number of the ring's front
	byID  map[string]uint64 // ID → sequence number
}

// dlSlot is a dead letter in the ring, or a hole left by Delete.
type dlSlot struct {
	dl   DeadLetter
	hole bool
}

var _ DeadLetterStore = (*MemoryDeadLetterStore)(nil)

// NewMemoryDeadLetterStore returns a store that holds at most capacity dead
// letters (DefaultDeadLetterCapacity if capacity <= 0) and logs evictions to
// logger (nowhere if nil).
func NewMemoryDeadLetterStore(capacity int, logger *slog.Logger) *MemoryDeadLetterStore {
	if capacity <= 0 {
		capacity = DefaultDeadLetterCapacity
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &MemoryDeadLetterStore{capacity: capacity, logger: logger, byID: make(map[string]uint64),
		evictLog: newLogLimit(logger, slog.LevelWarn, "broker: more dead letters evicted from the full store",
			deadLetterWindow, deadLetterLines, 0, false)}
}

// Put stores dl, evicting the oldest dead letter if the store is full. A
// dead letter with an ID already stored replaces it (and becomes the
// newest).
func (s *MemoryDeadLetterStore) Put(ctx context.Context, dl DeadLetter) error {
	ctx = orBackground(ctx)
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl.ID == "" {
		return fmt.Errorf("%w: dead letter without ID", ErrInvalidOption)
	}
	var victim DeadLetter
	evicted := false
	s.mu.Lock()
	if seq, ok := s.byID[dl.ID]; ok {
		s.holeLocked(seq)
	} else if len(s.byID) >= s.capacity {
		victim, evicted = s.popOldestLocked()
	}
	s.byID[dl.ID] = s.first + uint64(s.ring.Len())
	slot := s.ring.Append()
	slot.dl = dl
	s.mu.Unlock()
	if evicted {
		n := s.evicted.Add(1)
		if !s.logger.Enabled(ctx, slog.LevelWarn) || !s.evictLog.allow(logKey{}) {
			return nil
		}
		s.logger.LogAttrs(ctx, slog.LevelWarn, "broker: dead-letter store full, evicted oldest",
			slog.String("dead_letter_id", victim.ID),
			slog.String("topic", victim.Message.Topic),
			slog.String("message_id", victim.Message.ID),
			slog.String("subscriber", victim.Subscriber),
			slog.String("error_code", victim.ErrorCode),
			slog.Int("capacity", s.capacity),
			slog.Uint64("evicted_total", n))
	}
	return nil
}

// popOldestLocked removes and returns the oldest dead letter (the store
// is not empty).
func (s *MemoryDeadLetterStore) popOldestLocked() (DeadLetter, bool) {
	for {
		slot, ok := s.ring.Pop()
		if !ok {
			return DeadLetter{}, false
		}
		s.first++
		if !slot.hole {
			delete(s.byID, slot.dl.ID)
			return slot.dl, true
		}
	}
}

// holeLocked deletes the dead letter at seq, leaving a hole; holes at the
// front are dropped, and the ring is compacted when holes outnumber dead
// letters.
func (s *MemoryDeadLetterStore) holeLocked(seq uint64) {
	slot := s.ring.At(int(seq - s.first))
	delete(s.byID, slot.dl.ID)
	*slot = dlSlot{hole: true}
	for f := s.ring.Front(); f != nil && f.hole; f = s.ring.Front() {
		s.ring.Pop()
		s.first++
	}
	if holes := s.ring.Len() - len(s.byID); holes > 64 && holes > len(s.byID) {
		var kept fifo.Ring[dlSlot]
		for {
			slot, ok := s.ring.Pop()
			if !ok {
				break
			}
			if !slot.hole {
				s.byID[slot.dl.ID] = s.first + uint64(kept.Len())
				kept.Push(slot)
			}
		}
		s.ring = kept
	}
}

// List returns the matching dead letters, oldest first.
func (s *MemoryDeadLetterStore) List(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	ctx = orBackground(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []DeadLetter
	for i := range s.ring.Len() {
		slot := s.ring.At(i)
		if slot.hole || !f.Match(slot.dl) {
			continue
		}
		out = append(out, slot.dl)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// Get returns the dead letter with the given ID.
func (s *MemoryDeadLetterStore) Get(ctx context.Context, id string) (DeadLetter, bool, error) {
	ctx = orBackground(ctx)
	if err := ctx.Err(); err != nil {
		return DeadLetter{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seq, ok := s.byID[id]
	if !ok {
		return DeadLetter{}, false, nil
	}
	return s.ring.At(int(seq - s.first)).dl, true, nil
}

// Delete removes the given IDs; unknown IDs are ignored.
func (s *MemoryDeadLetterStore) Delete(ctx context.Context, ids ...string) error {
	ctx = orBackground(ctx)
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if seq, ok := s.byID[id]; ok {
			s.holeLocked(seq)
		}
	}
	return nil
}

// Len returns how many dead letters are stored.
func (s *MemoryDeadLetterStore) Len(ctx context.Context) (int, error) {
	ctx = orBackground(ctx)
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID), nil
}

// orBackground is ctx, or context.Background() for a nil ctx (the package
// doc promises it for every method taking a ctx).
func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// Capacity returns the most dead letters the store holds.
func (s *MemoryDeadLetterStore) Capacity() int { return s.capacity }

// Evicted returns how many dead letters were evicted to make room.
func (s *MemoryDeadLetterStore) Evicted() uint64 { return s.evicted.Load() }
