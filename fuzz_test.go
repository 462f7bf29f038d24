package broker

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// Fuzz targets. Their seed corpora live in testdata/fuzz; CI runs each for
// a few seconds:
//
//	go test -run '^$' -fuzz '^FuzzMessageValidation$' -fuzztime 10s .

// FuzzMessageValidation: Publish never panics; a message without ID or
// Topic is refused with ErrInvalidMessage, any other is accepted (or meets
// a full queue); Subscribe refuses bad arguments with ErrInvalidOption.
func FuzzMessageValidation(f *testing.F) {
	f.Add("m-1", "orders", "k", []byte("payload"), "billing", 1, 16, int64(0))
	f.Add("", "orders", "", []byte(nil), "", 0, 0, int64(-1))
	f.Add("m", "", "k", []byte{0}, "s", -5, -1, int64(time.Second))
	f.Add("\x00", "\xff", "\u2028", []byte("x"), "\x00", math.MaxInt32, math.MaxInt32, int64(math.MaxInt64))
	b, err := New(WithLogger(discard), WithPublishTimeout(0), WithQueueSize(8))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = b.Close(context.Background()) })
	f.Fuzz(func(t *testing.T, id, topic, key string, payload []byte, name string, concurrency, lane int, timeout int64) {
		err := b.Publish(context.Background(), Message{ID: id, Topic: topic, Key: key, Payload: payload})
		switch {
		case id == "" || topic == "":
			if !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("Publish(id %q, topic %q) = %v, want ErrInvalidMessage", id, topic, err)
			}
			if !strings.Contains(err.Error(), "empty") {
				t.Fatalf("error %q does not say what is wrong", err)
			}
		case err != nil && !errors.Is(err, ErrQueueFull):
			t.Fatalf("Publish(id %q, topic %q) = %v", id, topic, err)
		}

		valid := topic != "" && name != "" && concurrency >= 1 && concurrency <= MaxConcurrency &&
			lane >= 1 && lane <= MaxQueueSize && timeout >= 0
		if concurrency > 64 { // keep each input cheap: big but valid values are covered by tests
			concurrency = 64
		}
		sub, err := b.Subscribe(topic, name, func(context.Context, Message) error { return nil },
			Concurrency(concurrency), LaneSize(lane), HandlerTimeout(time.Duration(timeout)))
		if !valid {
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("Subscribe(%q, %q, concurrency %d, lane %d, timeout %d) = %v, want ErrInvalidOption",
					topic, name, concurrency, lane, timeout, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Subscribe(%q, %q, concurrency %d, lane %d, timeout %d) = %v", topic, name, concurrency, lane, timeout, err)
		}
		if err := sub.Unsubscribe(context.Background()); err != nil {
			t.Fatalf("Unsubscribe: %v", err)
		}
	})
}

// FuzzBackoff: no negative or overflowed delay for any attempt number, the
// cap is honoured, jitter stays within [d/2, d], and the policy's decision
// keeps attempts within the rule's bound.
func FuzzBackoff(f *testing.F) {
	f.Add(int64(50*time.Millisecond), int64(5*time.Second), 1, 2, int64(0))
	f.Add(int64(1), int64(math.MaxInt64), 63, 0, int64(-1))
	f.Add(int64(-1), int64(-1), -1, -1, int64(math.MaxInt64))
	f.Add(int64(math.MaxInt64), int64(1), math.MaxInt, math.MaxInt32, int64(time.Hour))
	f.Fuzz(func(t *testing.T, base, maxD int64, retry, maxRetries int, after int64) {
		b, m := time.Duration(base), time.Duration(maxD)
		d := ExponentialBackoff(b, m)(retry)
		if d < 0 {
			t.Fatalf("ExponentialBackoff(%v, %v)(%d) = %v < 0", b, m, retry, d)
		}
		if b <= 0 {
			if d != 0 {
				t.Fatalf("non-positive base gave %v", d)
			}
		} else {
			capD := max(m, b)
			if d > capD {
				t.Fatalf("ExponentialBackoff(%v, %v)(%d) = %v above the cap %v", b, m, retry, d, capD)
			}
			full := exponential(b, capD, retry)
			if full <= 0 || full > capD || d < full-full/2 || d > full {
				t.Fatalf("retry %d: delay %v outside [%v, %v]", retry, d, full-full/2, full)
			}
		}
		if c := ConstantBackoff(m)(retry); c < 0 {
			t.Fatalf("ConstantBackoff(%v) = %v", m, c)
		}

		p := RetryPolicy{MaxRetries: maxRetries, Backoff: ExponentialBackoff(b, m)}
		if err := p.validate(); err != nil {
			t.Fatalf("validate(MaxRetries %d) = %v", maxRetries, err)
		}
		p = p.normalized()
		attempt := max(retry, 1)
		v := p.decide(failure{code: CodeThrottled, after: time.Duration(after)}, attempt)
		if v.delay < 0 {
			t.Fatalf("decide: negative delay %v", v.delay)
		}
		allowed := maxRetries // 0: the default; negative: none
		if allowed == 0 {
			allowed = DefaultMaxRetries
		}
		if v.retry != (attempt <= allowed) {
			t.Fatalf("decide(attempt %d, MaxRetries %d) retry = %v", attempt, maxRetries, v.retry)
		}
		if v.retry && after > 0 && v.delay < time.Duration(after) {
			t.Fatalf("RetryAfter %v not honoured: delay %v", time.Duration(after), v.delay)
		}
	})
}

// FuzzDeadLetterQuery: List returns exactly the matching dead letters,
// oldest first, at most Limit; a negative Limit is an error, never a panic.
func FuzzDeadLetterQuery(f *testing.F) {
	f.Add([]byte("aabbcab"), "a", "", "", 0, 3)
	f.Add([]byte{}, "", "", "", -1, 1)
	f.Add([]byte("abcabcabcabc"), "b", "c", "a", 2, 5)
	f.Add([]byte("zzzz"), "z", "z", "z", math.MaxInt32, 0)
	f.Fuzz(func(t *testing.T, script []byte, topic, sub, code string, limit, capacity int) {
		capacity = max(1, min(capacity, 64))
		s := NewMemoryDeadLetterStore(capacity, discard)
		ctx := context.Background()
		field := func(c byte) string { return string(rune('a' + c%3)) }
		var all []DeadLetter
		for i, c := range script {
			dl := DeadLetter{ID: string(rune('A'+i%26)) + field(c) + string(rune('0'+i/26)),
				Message: Message{ID: "m", Topic: field(c)}, Subscriber: field(c >> 2), ErrorCode: field(c >> 4)}
			if err := s.Put(ctx, dl); err != nil {
				t.Fatal(err)
			}
			all = append(all, dl)
			if len(all) > capacity {
				all = all[1:]
			}
		}
		f := DeadLetterFilter{Topic: topic, Subscriber: sub, ErrorCode: code, Limit: limit}
		got, err := s.List(ctx, f)
		if limit < 0 {
			if !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("List(Limit %d) = %v, want ErrInvalidOption", limit, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var want []DeadLetter
		for _, dl := range all {
			if f.Match(dl) && (limit == 0 || len(want) < limit) {
				want = append(want, dl)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("List(%+v) returned %d, want %d", f, len(got), len(want))
		}
		for i := range got {
			if got[i].ID != want[i].ID {
				t.Fatalf("List(%+v)[%d] = %s, want %s (oldest first)", f, i, got[i].ID, want[i].ID)
			}
		}
		if n, _ := s.Len(ctx); n != len(all) {
			t.Fatalf("Len = %d, want %d (capacity %d)", n, len(all), capacity)
		}
	})
}

// FuzzDedupStore: the default idempotency store against a model. The ops
// record or look up one of up to 32 keys at a date from 1 to 256 (window
// 64), going back as well as forward; keys are placed by hashes derived
// from the input, so a finding replays. Whatever the store evicts, a lookup
// may find a key only if one of its recorded dates is less than the window
// from the lookup's: anything else would drop a message that is no
// duplicate. While no more than eight keys were recorded nothing can have
// been evicted, so the store must then agree with the model exactly.
func FuzzDedupStore(f *testing.F) {
	f.Add(uint8(8), uint8(0), []byte{0, 1, 10, 1, 1, 50, 0, 2, 200, 1, 2, 90, 1, 1, 140})
	f.Add(uint8(64), uint8(7), []byte{0, 7, 255, 0, 7, 1, 1, 7, 120, 1, 7, 160, 0, 3, 0})
	f.Add(uint8(8), uint8(1), []byte{0, 1, 1, 0, 2, 1, 0, 3, 1, 0, 4, 1, 0, 5, 1, 0, 6, 1, 0, 7, 1, 0, 8, 1, 0, 9, 200, 1, 1, 5})
	f.Fuzz(func(t *testing.T, size, seed uint8, ops []byte) {
		const window = 64
		s := NewMemoryIdempotencyStore(window, max(int(size), 8))
		dates := map[int][]int64{} // key: every date it was recorded at
		// entries models the store's entries of each key: one date, or
		// two (the earliest and the latest) once a delivery came more
		// than the window from the first; a later date moves the one it
		// is beyond (see record).
		entries := map[int][]int64{}
		inWindow := func(a, b int64) bool { return a-b < window && b-a < window }
		nEntries := 0
		for ; len(ops) >= 3; ops = ops[3:] {
			k, date := int(ops[1]%32), 1+int64(ops[2])
			sl := s.slotFor(dedupSalt{}, placedKey(k, uint64(seed)), date)
			if ops[0]%2 == 0 {
				s.record(sl)
				dates[k] = append(dates[k], date)
				switch e := entries[k]; len(e) {
				case 0:
					entries[k] = []int64{date}
					nEntries++
				case 1:
					if inWindow(date, e[0]) {
						e[0] = max(e[0], date)
					} else {
						entries[k] = append(e, date)
						nEntries++
					}
				case 2:
					lo, hi := 0, 1
					if e[1] < e[0] {
						lo, hi = 1, 0
					}
					if date > e[hi] {
						e[hi] = date
					} else if date < e[lo] {
						e[lo] = date
					}
				}
				continue
			}
			within := false
			for _, at := range dates[k] {
				within = within || inWindow(at, date)
			}
			exact := false
			for _, at := range entries[k] {
				exact = exact || inWindow(at, date)
			}
			got := s.seen(sl)
			if got && !within {
				t.Fatalf("key %d looked up at %d: seen, but it was recorded only at %v (window %d)", k, date, dates[k], window)
			}
			if nEntries <= 8 && got != exact {
				t.Fatalf("key %d looked up at %d: seen %v, want %v (recorded at %v; nothing evicted)", k, date, got, exact, dates[k])
			}
		}
		if n := s.Len(); n > s.Cap() {
			t.Fatalf("Len %d > Cap %d", n, s.Cap())
		}
	})
}
