package natsjs_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ListNewest reads the stream backwards in widening windows: the newest
// matches come from the first window, the oldest one from the last, and a
// version replaced meanwhile is listed once, as its newest.
func TestListNewestAcrossWindows(t *testing.T) {
	conn := embedded(t, "")
	s, err := natsjs.NewDeadLetterStore(t.Context(), conn.JetStream())
	require.NoError(t, err)
	ctx := t.Context()
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	put := func(id, reason string, at time.Duration) {
		t.Helper()
		require.NoError(t, s.Put(ctx, broker.DeadLetter{ID: id, Subscriber: "card", Reason: reason, ErrorCode: "overflow",
			Message: broker.Message{ID: "m-" + id, Topic: "pay"}, FailedAt: base.Add(at)}))
	}
	put("first", broker.ReasonExhausted, 0)
	const n = 1500 // windows of 256, 512, 1024: three of them
	for i := range n {
		put(fmt.Sprint("shed-", i), broker.ReasonOverflow, time.Second+time.Duration(i)*time.Millisecond)
	}
	for i := range 5 {
		put(fmt.Sprint("new-", i), broker.ReasonExhausted, time.Hour+time.Duration(i)*time.Second)
	}
	put("shed-3", broker.ReasonOverflow, 2*time.Hour) // replaced: now the newest

	ids := func(q broker.DeadLetterQuery) []string {
		t.Helper()
		dls, err := broker.ListNewest(ctx, s, q)
		require.NoError(t, err)
		out := make([]string, len(dls))
		for i, dl := range dls {
			out[i] = dl.ID
		}
		return out
	}
	exhausted := broker.DeadLetterFilter{Reason: broker.ReasonExhausted}
	assert.Equal(t, []string{"new-4", "new-3", "new-2", "new-1", "new-0", "first"}, ids(broker.DeadLetterQuery{DeadLetterFilter: exhausted}))
	exhausted.Limit = 2
	assert.Equal(t, []string{"new-4", "new-3"}, ids(broker.DeadLetterQuery{DeadLetterFilter: exhausted}))
	assert.Equal(t, []string{"shed-3", "new-4"}, ids(broker.DeadLetterQuery{DeadLetterFilter: broker.DeadLetterFilter{Limit: 2}}))
	all := ids(broker.DeadLetterQuery{})
	assert.Len(t, all, n+6)
	assert.Equal(t, "first", all[len(all)-1])
	assert.Equal(t, []string{"m-first"}, func() []string {
		dls, err := s.ListNewest(ctx, broker.DeadLetterQuery{MessageID: "m-first"})
		require.NoError(t, err)
		var out []string
		for _, dl := range dls {
			out = append(out, dl.Message.ID)
		}
		return out
	}())
	assert.Equal(t, []string{"new-2", "new-1"}, ids(broker.DeadLetterQuery{Since: base.Add(time.Hour + time.Second), Until: base.Add(time.Hour + 3*time.Second)}))
	// The server filters by subject: a topic with nothing is one empty window per width.
	assert.Empty(t, ids(broker.DeadLetterQuery{DeadLetterFilter: broker.DeadLetterFilter{Topic: "nothing"}}))
}
