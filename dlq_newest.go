package broker

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// This file is the newest-first listing of dead letters: what an operator
// looks at first (what just failed), reachable in a large store without
// reading it all.

// DeadLetterQuery selects dead letters for ListNewest: a DeadLetterFilter
// (Limit included) and, beyond it, a message ID and a FailedAt range.
type DeadLetterQuery struct {
	DeadLetterFilter
	// MessageID, when set, must equal the dead letter's Message.ID.
	MessageID string
	// Since, when set, excludes dead letters that failed before it.
	Since time.Time
	// Until, when set, excludes dead letters that failed at or after it.
	Until time.Time
}

// Match reports whether dl satisfies the query (Limit aside).
func (q DeadLetterQuery) Match(dl DeadLetter) bool {
	return q.DeadLetterFilter.Match(dl) &&
		(q.MessageID == "" || q.MessageID == dl.Message.ID) &&
		(q.Since.IsZero() || !dl.FailedAt.Before(q.Since)) &&
		(q.Until.IsZero() || dl.FailedAt.Before(q.Until))
}

// Validate reports a malformed query (a negative Limit, Until not after
// Since), wrapping ErrInvalidOption.
func (q DeadLetterQuery) Validate() error {
	if err := q.DeadLetterFilter.Validate(); err != nil {
		return err
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since) {
		return fmt.Errorf("%w: dead-letter query Until %v not after Since %v", ErrInvalidOption, q.Until, q.Since)
	}
	return nil
}

// DeadLetterLister is an optional interface of a DeadLetterStore that
// lists newest first. ListNewest returns the dead letters matching q in
// the reverse of List's order (the most recently put first), at most
// q.Limit of them when q.Limit > 0, reading from the newest end: a query
// for the latest failures of a large store costs what it returns, not the
// store's size. MemoryDeadLetterStore and natsjs's store implement it; a
// store that does not still works with the ListNewest function, which
// falls back to List.
type DeadLetterLister interface {
	ListNewest(ctx context.Context, q DeadLetterQuery) ([]DeadLetter, error)
}

// ListNewest returns the dead letters of s matching q, newest first, at
// most q.Limit of them when q.Limit > 0. It calls s's ListNewest when s is
// a DeadLetterLister; otherwise it lists every dead letter matching q's
// filter with List (oldest first: the whole match is read, however large)
// and keeps the newest that match the rest of q.
func ListNewest(ctx context.Context, s DeadLetterStore, q DeadLetterQuery) ([]DeadLetter, error) {
	ctx = orBackground(ctx)
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if l, ok := s.(DeadLetterLister); ok {
		return l.ListNewest(ctx, q)
	}
	f := q.DeadLetterFilter
	f.Limit = 0
	all, err := s.List(ctx, f)
	if err != nil {
		return nil, err
	}
	var out []DeadLetter
	for i := len(all) - 1; i >= 0 && (q.Limit == 0 || len(out) < q.Limit); i-- {
		if q.Match(all[i]) {
			out = append(out, all[i])
		}
	}
	return out, nil
}

var _ DeadLetterLister = (*MemoryDeadLetterStore)(nil)

// ListNewest returns the matching dead letters, newest first, scanning
// from the newest end and stopping at q.Limit.
func (s *MemoryDeadLetterStore) ListNewest(ctx context.Context, q DeadLetterQuery) ([]DeadLetter, error) {
	ctx = orBackground(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []DeadLetter
	for i := s.ring.Len() - 1; i >= 0; i-- {
		slot := s.ring.At(i)
		if slot.hole || !q.Match(slot.dl) {
			continue
		}
		out = append(out, slot.dl)
		if q.Limit > 0 && len(out) == q.Limit {
			break
		}
	}
	return slices.Clip(out), nil
}
