package broker

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
)

// benchIDs are pre-built message IDs, so benchmarks measure the broker and
// not strconv.
var benchIDs = func() []string {
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = "m-" + strconv.Itoa(i)
	}
	return ids
}()

func benchBroker(b *testing.B, opts ...Option) *Broker {
	b.Helper()
	br, err := New(append([]Option{WithLogger(discard), WithPublishTimeout(DefaultPublishTimeout * 20)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = br.Close(context.Background()) })
	return br
}

// counter is a handler that signals done after n deliveries.
type counter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func newCounter(want int) *counter { return &counter{want: int64(want), done: make(chan struct{})} }

func (c *counter) handle(context.Context, Message) error {
	if c.n.Add(1) == c.want {
		close(c.done)
	}
	return nil
}

// BenchmarkPublish measures Publish alone: the topic has no subscriber, so
// its dispatcher only counts messages as unrouted.
func BenchmarkPublish(b *testing.B) {
	br := benchBroker(b)
	payload := make([]byte, 64)
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := br.Publish(ctx, Message{ID: benchIDs[i&(len(benchIDs)-1)], Topic: "t", Payload: payload}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublishDeliver measures publish to handled, end to end, for 1
// and 8 subscribers (per published message), with dedup on and off.
func BenchmarkPublishDeliver(b *testing.B) {
	for _, tc := range []struct {
		name  string
		subs  int
		dedup bool
	}{
		{"subs=1/dedup", 1, true},
		{"subs=1/nodedup", 1, false},
		{"subs=8/dedup", 8, true},
		{"subs=8/nodedup", 8, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var opts []Option
			if !tc.dedup {
				opts = append(opts, WithIdempotencyStore(nil))
			}
			br := benchBroker(b, opts...)
			counters := make([]*counter, tc.subs)
			for i := range counters {
				counters[i] = newCounter(b.N)
				if _, err := br.Subscribe("t", "s"+strconv.Itoa(i), counters[i].handle); err != nil {
					b.Fatal(err)
				}
			}
			payload := make([]byte, 64)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				// IDs repeat every 65,536 messages; without dedup that is harmless,
				// with it they are distinct within any run short of that.
				id := benchIDs[i&(len(benchIDs)-1)]
				if tc.dedup {
					id = strconv.Itoa(i)
				}
				if err := br.Publish(ctx, Message{ID: id, Topic: "t", Payload: payload}); err != nil {
					b.Fatal(err)
				}
			}
			for _, c := range counters {
				<-c.done
			}
		})
	}
}

// BenchmarkPublishParallelTopics publishes from many goroutines, each to its
// own topic: topics must not serialise on a shared lock. Run with -cpu 1,2,4.
func BenchmarkPublishParallelTopics(b *testing.B) {
	br := benchBroker(b, WithQueueSize(1<<14))
	var next atomic.Int64
	payload := make([]byte, 64)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		topic := "t" + strconv.FormatInt(next.Add(1), 10)
		ctx := context.Background()
		i := 0
		for pb.Next() {
			if err := br.Publish(ctx, Message{ID: benchIDs[i&(len(benchIDs)-1)], Topic: topic, Payload: payload}); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkRetryPath measures a delivery that fails once and succeeds on an
// immediate retry.
func BenchmarkRetryPath(b *testing.B) {
	br := benchBroker(b, WithIdempotencyStore(nil), WithRetryPolicy(RetryPolicy{MaxRetries: 1, Backoff: ConstantBackoff(0)}))
	c := newCounter(b.N)
	if _, err := br.Subscribe("t", "s", func(ctx context.Context, m Message) error {
		if m.Attempt == 1 {
			return errBoom
		}
		return c.handle(ctx, m)
	}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if err := br.Publish(ctx, Message{ID: benchIDs[i&(len(benchIDs)-1)], Topic: "t"}); err != nil {
			b.Fatal(err)
		}
	}
	<-c.done
}

// BenchmarkDedupLookup measures the default idempotency store's Seen on a
// hit, from parallel goroutines.
func BenchmarkDedupLookup(b *testing.B) {
	s := NewMemoryIdempotencyStore(0, 0)
	ctx := context.Background()
	for _, id := range benchIDs[:4096] {
		_ = s.Record(ctx, DeliveryKey{Topic: "t", Subscriber: "s", MessageID: id})
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if seen, _ := s.Seen(ctx, DeliveryKey{Topic: "t", Subscriber: "s", MessageID: benchIDs[i&4095]}); !seen {
				b.Fatal("not seen")
			}
			i++
		}
	})
}

// BenchmarkDedupDeliver measures what the default idempotency store costs a
// worker per delivery: the lookup and, for an ID it does not hold, the
// record, in a full table (a record replaces an entry), as in a long run.
// The IDs cycle through 2.6 times as many as the table holds.
func BenchmarkDedupDeliver(b *testing.B) {
	s := NewMemoryIdempotencyStore(0, 0)
	salt := s.salt("t", "s")
	hs := make([]idHash, 1<<18)
	for i := range hs {
		hs[i] = s.hashID("m-" + strconv.Itoa(i))
	}
	date := int64(0)
	deliver := func(i int) {
		date++
		if sl := s.slotFor(salt, hs[i&(len(hs)-1)], date); !s.seen(sl) {
			s.record(sl)
		}
	}
	for i := range len(hs) {
		deliver(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		deliver(i)
	}
}

// BenchmarkStats measures a Stats snapshot of 16 topics with 4 subscribers
// each.
func BenchmarkStats(b *testing.B) {
	br := benchBroker(b)
	for t := range 16 {
		for s := range 4 {
			if _, err := br.Subscribe("t"+strconv.Itoa(t), "s"+strconv.Itoa(s), func(context.Context, Message) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = br.Stats()
	}
}
