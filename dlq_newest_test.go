package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// listOnly hides MemoryDeadLetterStore's ListNewest: ListNewest falls back
// to List.
type listOnly struct{ DeadLetterStore }

// In a store of 50,000 overflow dead letters, the 10 exhausted ones that
// failed last are what ListNewest returns first, through the store's
// ListNewest and through the fallback alike; a query bounded in time gets
// only those inside it.
func TestListNewestFindsRecentInLargeStore(t *testing.T) {
	const n = 50_000
	mem := NewMemoryDeadLetterStore(n+10, nil)
	ctx := context.Background()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		require.NoError(t, mem.Put(ctx, DeadLetter{ID: fmt.Sprint("old-", i), Subscriber: "card", Reason: ReasonOverflow,
			Message: Message{ID: fmt.Sprint("m-", i), Topic: "pay"}, FailedAt: base.Add(time.Duration(i) * time.Millisecond)}))
	}
	var want []string
	for i := range 10 {
		id := fmt.Sprint("new-", i)
		want = append([]string{id}, want...)
		require.NoError(t, mem.Put(ctx, DeadLetter{ID: id, Subscriber: "billing", Reason: ReasonExhausted,
			Message: Message{ID: fmt.Sprint("n-", i), Topic: "orders"}, FailedAt: base.Add(time.Hour + time.Duration(i)*time.Second)}))
	}
	idsOf := func(dls []DeadLetter) []string {
		out := make([]string, len(dls))
		for i, dl := range dls {
			out[i] = dl.ID
		}
		return out
	}
	for name, s := range map[string]DeadLetterStore{"lister": mem, "fallback": listOnly{mem}} {
		t.Run(name, func(t *testing.T) {
			got, err := ListNewest(ctx, s, DeadLetterQuery{DeadLetterFilter: DeadLetterFilter{Reason: ReasonExhausted, Limit: 10}})
			require.NoError(t, err)
			assert.Equal(t, want, idsOf(got))

			got, err = ListNewest(ctx, s, DeadLetterQuery{DeadLetterFilter: DeadLetterFilter{Limit: 3}})
			require.NoError(t, err)
			assert.Equal(t, want[:3], idsOf(got), "newest first, whatever the reason")

			got, err = ListNewest(ctx, s, DeadLetterQuery{Since: base.Add(time.Hour + 5*time.Second), Until: base.Add(time.Hour + 8*time.Second)})
			require.NoError(t, err)
			assert.Equal(t, []string{"new-7", "new-6", "new-5"}, idsOf(got))

			got, err = ListNewest(ctx, s, DeadLetterQuery{MessageID: "m-123"})
			require.NoError(t, err)
			assert.Equal(t, []string{"old-123"}, idsOf(got))

			_, err = ListNewest(ctx, s, DeadLetterQuery{Since: base, Until: base})
			assert.ErrorIs(t, err, ErrInvalidOption)
		})
	}
}

// BenchmarkListNewestRecent is the admin page's first page of a filter in
// a store of 50,000: the store's ListNewest stops at the limit, the
// fallback reads every match of the filter through List.
func BenchmarkListNewestRecent(b *testing.B) {
	const n = 50_000
	mem := NewMemoryDeadLetterStore(n, nil)
	ctx := context.Background()
	for i := range n {
		reason := ReasonOverflow
		if i%100 == 0 {
			reason = ReasonExhausted
		}
		_ = mem.Put(ctx, DeadLetter{ID: fmt.Sprint(i), Reason: reason, Message: Message{ID: fmt.Sprint(i), Topic: "t"}})
	}
	q := DeadLetterQuery{DeadLetterFilter: DeadLetterFilter{Reason: ReasonExhausted, Limit: 51}}
	for name, s := range map[string]DeadLetterStore{"lister": mem, "fallback": listOnly{mem}} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := ListNewest(ctx, s, q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
