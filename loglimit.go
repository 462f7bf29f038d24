package broker

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// How often the broker logs what could flood the log. The figures are
// documented on WithLogger.
const (
	// A dead letter is logged (Warn) up to deadLetterLines times per
	// deadLetterWindow for each subscriber and reason; past that, one
	// summary line per window counts the rest. A dead letter the store
	// refused (Error) is always logged.
	deadLetterLines  = 10
	deadLetterWindow = time.Second
	// A hint (an unrouted message, a skipped duplicate) is logged (Info)
	// once per hintWindow for each topic (unrouted) or subscriber
	// (duplicate), and at most hintLines times per window overall; one
	// summary line per window counts the rest.
	hintLines  = 10
	hintWindow = time.Minute
	// logKeys bounds the keys a limiter tracks in one window: the lines of
	// further keys are counted together, never let through.
	logKeys = 1024
)

// logKey is what a limiter counts lines by: a topic, a subscriber of it,
// and for dead letters a reason.
type logKey struct{ topic, subscriber, reason string }

// logLimit lets a kind of log line through at most perKey times per
// window for each key, and at most overall times per window for all keys
// (0: no overall cap); it counts the lines it holds back, and a timer logs
// them as summary lines when the window ends. A window starts with the
// first line after the last one ended. Safe for concurrent use; the
// summary is logged without the lock held.
type logLimit struct {
	log     *slog.Logger
	level   slog.Level // of the summary lines
	msg     string     // the summary line's message
	window  time.Duration
	perKey  int
	overall int
	// perKeySummary: one summary line per key (dead letters, whose keys
	// are the live subscribers' reasons); otherwise one for all keys.
	perKeySummary bool

	mu      sync.Mutex     // guards the fields below
	start   time.Time      // of the current window; zero: none
	lines   int            // let through in this window, all keys
	byKey   map[logKey]int // let through in this window, by key
	held    map[logKey]int // held back in this window, by key
	other   int            // held back for keys past logKeys
	timer   *time.Timer    // ends the window with a summary; nil: none set
	flushed sync.WaitGroup // a summary being logged by the timer
	closed  bool           // flushed for good: lines are held without a timer
}

func newLogLimit(log *slog.Logger, level slog.Level, msg string, window time.Duration, perKey, overall int, perKeySummary bool) *logLimit {
	return &logLimit{log: log, level: level, msg: msg, window: window, perKey: perKey, overall: overall, perKeySummary: perKeySummary}
}

// allow reports whether a line for k may be logged now; if not, it is
// counted for the window's summary.
func (l *logLimit) allow(k logKey) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.start.IsZero() || (l.timer == nil && now.Sub(l.start) >= l.window) {
		l.start, l.lines = now, 0
		clear(l.byKey)
	}
	if l.byKey == nil {
		l.byKey, l.held = make(map[logKey]int), make(map[logKey]int)
	}
	n, known := l.byKey[k]
	if !known && len(l.byKey) >= logKeys {
		l.holdLocked(nil)
		return false
	}
	if n < l.perKey && (l.overall == 0 || l.lines < l.overall) {
		l.byKey[k] = n + 1
		l.lines++
		return true
	}
	l.byKey[k] = n
	l.holdLocked(&k)
	return false
}

// holdLocked counts a line held back (for k; nil: past logKeys) and makes
// sure a timer ends the window.
func (l *logLimit) holdLocked(k *logKey) {
	if k != nil && (l.perKeySummary || len(l.held) < logKeys) {
		l.held[*k]++
	} else {
		l.other++
	}
	if l.timer == nil && !l.closed {
		l.flushed.Add(1)
		l.timer = time.AfterFunc(time.Until(l.start.Add(l.window)), func() {
			defer l.flushed.Done()
			l.flush(false)
		})
	}
}

// flush logs the summary of the lines held back and ends the window. At
// the broker's Close (final), it first stops the timer, or waits for its
// summary, so that no line comes later.
func (l *logLimit) flush(final bool) {
	l.mu.Lock()
	if final {
		l.closed = true
		if l.timer != nil && l.timer.Stop() {
			l.flushed.Done()
		}
	}
	window := time.Since(l.start).Round(time.Millisecond)
	held, other := l.held, l.other
	l.held, l.other, l.timer = make(map[logKey]int), 0, nil
	l.start = time.Time{} // the next line starts a window
	l.mu.Unlock()
	if final {
		l.flushed.Wait()
	}
	l.summarise(held, other, window)
}

// summarise logs the summary lines for what a window held back.
func (l *logLimit) summarise(held map[logKey]int, other int, window time.Duration) {
	if len(held) == 0 && other == 0 {
		return
	}
	ctx := context.Background()
	if l.perKeySummary {
		for k, n := range held {
			l.log.LogAttrs(ctx, l.level, l.msg,
				slog.String("topic", k.topic), slog.String("subscriber", k.subscriber), slog.String("reason", k.reason),
				slog.Int("suppressed", n), slog.Duration("window", window))
		}
		if other > 0 {
			l.log.LogAttrs(ctx, l.level, l.msg, slog.Int("suppressed", other), slog.Duration("window", window),
				slog.Int("keys_over", logKeys))
		}
		return
	}
	total, keys := other, len(held)
	for _, n := range held {
		total += n
	}
	attrs := []slog.Attr{slog.Int("suppressed", total), slog.Duration("window", window)}
	if keys > 0 {
		attrs = append(attrs, slog.Int("keys", keys))
	}
	l.log.LogAttrs(ctx, l.level, l.msg, attrs...)
}

// logLimits are a broker's limiters of lines that could flood its log.
type logLimits struct {
	unrouted, duplicate, deadLetter *logLimit
	window                          time.Duration // the default dedup store's window, for the duplicate hint; 0: a store of one's own
}

func newLogLimits(log *slog.Logger, dedupWindow time.Duration) *logLimits {
	return &logLimits{
		unrouted:   newLogLimit(log, slog.LevelInfo, "broker: more messages published to topics without a subscriber (counted Unrouted); subscribe before publishing", hintWindow, 1, hintLines, false),
		duplicate:  newLogLimit(log, slog.LevelInfo, "broker: more duplicate message IDs skipped (counted Deduplicated)", hintWindow, 1, hintLines, false),
		deadLetter: newLogLimit(log, slog.LevelWarn, "broker: more dead letters not logged one by one", deadLetterWindow, deadLetterLines, 0, true),
		window:     dedupWindow,
	}
}

// flush logs what the limiters held back; no line of theirs comes later.
func (l *logLimits) flush() {
	l.unrouted.flush(true)
	l.duplicate.flush(true)
	l.deadLetter.flush(true)
}
