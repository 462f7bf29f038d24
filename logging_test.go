package broker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// logLines records the log records at Info and above, as "LEVEL msg
// key=value ..." lines.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Enabled(_ context.Context, level slog.Level) bool { return level >= slog.LevelInfo }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler               { return l }
func (l *logLines) WithGroup(string) slog.Handler                    { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, b.String())
	return nil
}

// matching returns the lines that contain every one of subs.
func (l *logLines) matching(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range l.lines {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// TestUnroutedIsLogged: the first message published to a topic without a
// subscriber is logged at Info with the hint, the rest of the minute are
// counted in one summary line; a million topic names do not give a
// million lines (at most hintLines a minute overall).
func TestUnroutedIsLogged(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var logs logLines
		b := newTestBroker(t, WithLogger(slog.New(&logs)))
		for i := range 5 {
			require.NoError(t, b.Publish(context.Background(), Message{ID: fmt.Sprint("early-", i), Topic: "orders"}))
		}
		idle()
		first := logs.matching("INFO", "without a subscriber", "subscribe before publishing")
		require.Len(t, first, 1, "one line for the topic's first unrouted message")
		assert.Contains(t, first[0], "topic=orders")
		assert.Contains(t, first[0], "message_id=early-0")
		for i := range 1000 {
			require.NoError(t, b.Publish(context.Background(), Message{ID: "x", Topic: fmt.Sprint("topic-", i)}))
		}
		idle()
		assert.Len(t, logs.matching("INFO", "without a subscriber"), hintLines, "at most hintLines a minute overall")
		time.Sleep(hintWindow)
		idle()
		summary := logs.matching("INFO", "more messages published to topics without a subscriber")
		require.Len(t, summary, 1)
		assert.Contains(t, summary[0], fmt.Sprintf("suppressed=%d", 4+1000-(hintLines-1)))

		require.NoError(t, b.Publish(context.Background(), Message{ID: "later", Topic: "orders"}))
		idle()
		assert.Len(t, logs.matching("INFO", "without a subscriber", "message_id=later"), 1, "a new minute, a new line")
	})
}

// TestFirstDuplicateIsLogged: an entity ID reused as the message ID (the
// second event is skipped as a duplicate) is logged at Info at each
// subscriber, with the hint and the window; the rest are rate-limited.
func TestFirstDuplicateIsLogged(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var logs logLines
		b := newTestBroker(t, WithLogger(slog.New(&logs)))
		for _, name := range []string{"billing", "shipping"} {
			_, err := b.Subscribe("orders", name, func(context.Context, Message) error { return nil })
			require.NoError(t, err)
		}
		for _, status := range []string{"paid", "shipped", "delivered", "returned"} {
			require.NoError(t, b.Publish(context.Background(), Message{ID: "order-1001", Topic: "orders", Payload: []byte(status)}))
			idle()
		}
		for _, name := range []string{"billing", "shipping"} {
			lines := logs.matching("INFO", "duplicate message ID skipped", "subscriber="+name)
			require.Len(t, lines, 1, "one line per subscriber")
			assert.Contains(t, lines[0], "not an entity")
			assert.Contains(t, lines[0], "message_id=order-1001")
			assert.Contains(t, lines[0], "dedup_window=5m0s")
		}
		time.Sleep(hintWindow)
		idle()
		summary := logs.matching("INFO", "more duplicate message IDs skipped")
		require.Len(t, summary, 1)
		assert.Contains(t, summary[0], "suppressed=4")
		assert.Contains(t, summary[0], "keys=2")
	})
}

// TestDeadLetterLinesAreRateLimited: a subscriber shedding hundreds of
// messages logs deadLetterLines lines a second per reason, then a summary
// line with the count; a dead letter the store refused is always logged.
func TestDeadLetterLinesAreRateLimited(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var logs logLines
		b := newTestBroker(t, WithLogger(slog.New(&logs)))
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errBoom) })
		require.NoError(t, err)
		publishN(t, b, "t", "m", 100)
		idle()
		lines := logs.matching("WARN", "broker: dead-lettered", "subscriber=s", "reason=permanent")
		assert.Len(t, lines, deadLetterLines)
		for _, l := range lines {
			for _, field := range []string{"topic=t", "message_id=", "attempt=1", "error_code=permanent", "retryable=false", "final_state=dead_lettered", "dead_letter_id="} {
				assert.Contains(t, l, field)
			}
		}
		time.Sleep(deadLetterWindow)
		idle()
		summary := logs.matching("WARN", "more dead letters not logged one by one")
		require.Len(t, summary, 1)
		assert.Contains(t, summary[0], "subscriber=s")
		assert.Contains(t, summary[0], "reason=permanent")
		assert.Contains(t, summary[0], "suppressed=90")
		assert.Equal(t, uint64(100), subStats(t, b, "t", "s").DeadLettered, "every one counted")
	})
}

// A dead letter the store refused for good is logged at Error with every
// field, each of them: never folded into a summary.
func TestRefusedDeadLettersAreNeverFolded(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var logs logLines
		b := newTestBroker(t, WithLogger(slog.New(&logs)), WithDeadLetterStore(&refusingStore{MemoryDeadLetterStore: NewMemoryDeadLetterStore(0, nil)}))
		_, err := b.Subscribe("t", "s", func(context.Context, Message) error { return Permanent(errBoom) })
		require.NoError(t, err)
		publishN(t, b, "t", "m", 50)
		idle()
		assert.Len(t, logs.matching("ERROR", "broker: dead-lettered", "store_error="), 50)
		time.Sleep(deadLetterWindow)
		idle()
		assert.Empty(t, logs.matching("more dead letters not logged"))
	})
}

// TestEvictionLinesAreRateLimited: a full in-memory store logs its
// evictions 10 a second, then one summary line with the count.
func TestEvictionLinesAreRateLimited(t *testing.T) {
	bubble(t, func(t *testing.T) {
		var logs logLines
		st := NewMemoryDeadLetterStore(2, slog.New(&logs))
		for i := range 50 {
			require.NoError(t, st.Put(context.Background(), DeadLetter{ID: fmt.Sprint("d", i), Subscriber: "s"}))
		}
		assert.Equal(t, uint64(48), st.Evicted())
		assert.Len(t, logs.matching("WARN", "evicted oldest"), deadLetterLines)
		time.Sleep(deadLetterWindow)
		idle()
		summary := logs.matching("WARN", "more dead letters evicted")
		require.Len(t, summary, 1)
		assert.Contains(t, summary[0], "suppressed=38")
	})
}
