package admin

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
)

// putDeadLetters puts the dead letters make returns for 0..n-1 into b's
// store, failing one millisecond apart.
func putDeadLetters(t *testing.T, b *broker.Broker, n int, make func(i int) broker.DeadLetter) {
	t.Helper()
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		dl := make(i)
		if dl.ID == "" {
			dl.ID = fmt.Sprint("dl-", i)
		}
		if dl.FailedAt.IsZero() {
			dl.FailedAt = base.Add(time.Duration(i) * time.Millisecond)
		}
		require.NoError(t, b.DeadLetters().Put(context.Background(), dl))
	}
}

func plain(i int) broker.DeadLetter {
	return broker.DeadLetter{Message: broker.Message{ID: fmt.Sprint("m-", i), Topic: "orders"}, Subscriber: "billing",
		ErrorCode: broker.CodeError, Reason: broker.ReasonExhausted, Error: "failed"}
}

// TestHostileFieldSizes: each user-controlled field, at a hostile size,
// leaves the page and the JSON a bounded size. Before the caps: 50 errors
// of 256 KiB made a 13 MB page; a 5 MiB payload a 12 MB JSON answer.
func TestHostileFieldSizes(t *testing.T) {
	const kib = 1 << 10
	big := func(n int) string { return strings.Repeat("x", n) }
	for _, tc := range []struct {
		name   string
		n      int // dead letters
		dl     func(i int) broker.DeadLetter
		target string
		most   int // bytes
	}{
		{"errors of 256 KiB, list", 50, func(i int) broker.DeadLetter {
			dl := plain(i)
			dl.Error = big(256 * kib)
			return dl
		}, "/deadletters", 120 * kib},
		{"errors of 256 KiB, list JSON", 50, func(i int) broker.DeadLetter {
			dl := plain(i)
			dl.Error = big(256 * kib)
			return dl
		}, "/api/deadletters", 80 * kib},
		{"error of 256 KiB, detail", 1, func(i int) broker.DeadLetter {
			dl := plain(i)
			dl.Error = big(256 * kib)
			return dl
		}, "/deadletters/dl-0", DefaultPayloadLimit + 16*kib},
		{"message IDs of 10 KB, list", 50, func(i int) broker.DeadLetter {
			dl := plain(i)
			dl.Message.ID = big(10_000) + fmt.Sprint(i)
			return dl
		}, "/deadletters", 60 * kib},
		{"topic and subscriber of 10 KB, list", 50, func(i int) broker.DeadLetter {
			dl := plain(i)
			dl.Message.Topic, dl.Subscriber = big(10_000), big(10_000)
			return dl
		}, "/deadletters", 100 * kib},
		{"header of 64 KiB, detail", 1, func(i int) broker.DeadLetter {
			dl := plain(i)
			dl.Message.Headers = map[string]string{"x-big": big(64 * kib), big(64 * kib): "v"}
			return dl
		}, "/deadletters/dl-0", 24 * kib},
		{"text payload of 5 MiB, detail JSON", 1, func(i int) broker.DeadLetter {
			dl := plain(i)
			dl.Message.Payload = []byte(big(5 << 20))
			return dl
		}, "/api/deadletters/dl-0", 5<<20 + 4*kib},
		{"binary payload of 5 MiB, detail JSON", 1, func(i int) broker.DeadLetter {
			dl := plain(i)
			dl.Message.Payload = make([]byte, 5<<20)
			return dl
		}, "/api/deadletters/dl-0", 5<<20*4/3 + 4*kib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBroker(t)
			putDeadLetters(t, b, tc.n, tc.dl)
			h := newHandler(t, b, Options{})
			w := get(h, tc.target)
			require.Equal(t, 200, w.Code)
			size := w.Body.Len()
			t.Logf("%s: %d bytes", tc.target, size)
			assert.LessOrEqual(t, size, tc.most, "%s is %d bytes", tc.target, size)
		})
	}
}

// TestRecentDeadLettersInLargeStore: in a store of 50,000 dead letters,
// reason=exhausted finds the 10 that just failed, newest first, on the
// first page (before: 0 of them, the list being oldest first and the
// reason filtered over the first MaxScan).
func TestRecentDeadLettersInLargeStore(t *testing.T) {
	const n = 50_000
	b := newBroker(t, broker.WithDeadLetterStore(broker.NewMemoryDeadLetterStore(n+10, nil)))
	putDeadLetters(t, b, n, func(i int) broker.DeadLetter {
		dl := plain(i)
		dl.Message.Topic, dl.Subscriber, dl.Reason, dl.ErrorCode = "payments", "card", broker.ReasonOverflow, broker.CodeOverflow
		return dl
	})
	putDeadLetters(t, b, 10, func(i int) broker.DeadLetter {
		dl := plain(i)
		dl.ID = fmt.Sprint("recent-", i)
		dl.FailedAt = time.Date(2026, 12, 2, 0, 0, i, 0, time.UTC)
		return dl
	})
	h := newHandler(t, b, Options{})
	var list DeadLetterList
	start := time.Now()
	getJSON(t, h, "/api/deadletters?reason=exhausted", &list)
	took := time.Since(start)
	t.Logf("reason=exhausted over %d: %v", n+10, took)
	require.Len(t, list.DeadLetters, 10)
	assert.Equal(t, "recent-9", list.DeadLetters[0].ID, "newest first")
	assert.Equal(t, "recent-0", list.DeadLetters[9].ID)
	assert.True(t, list.NewestFirst)

	page := getOK(t, h, "/deadletters?reason=exhausted&since=2026-12-02T00:00:05")
	assert.Equal(t, 5, strings.Count(page, `data-dead-letter="recent-`), "a time range")
	page = getOK(t, h, "/deadletters?message_id=m-3")
	assert.Contains(t, page, `data-dead-letter="recent-3"`, "search by message ID")
	assert.Contains(t, page, `data-dead-letter="dl-3"`)
	assert.Equal(t, 2, strings.Count(page, `data-dead-letter="`))
	page = getOK(t, h, "/deadletters?order=oldest&limit=1")
	assert.Contains(t, page, `data-dead-letter="dl-0"`, "oldest first on request")
}
