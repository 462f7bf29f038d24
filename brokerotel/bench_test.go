package brokerotel_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/brokerotel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// benchMessages is how many messages one run publishes (W1's cell size).
const benchMessages = 100_000

// discard is a span exporter that drops what it gets.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkW1 is the benchmark suite's W1 (1 topic, 1 subscriber with a
// no-op handler, 1 publisher, 64 B payload) with and without the adapter:
// each run publishes 100k messages and waits until the last is handled.
// ns/msg, allocs/msg and B/msg cover that interval only (every allocation
// in the process, the span processor's included).
//
//	go test -run '^$' -bench W1 -benchtime 3x
func BenchmarkW1(b *testing.B) {
	cases := []struct {
		name    string
		sampler sdktrace.Sampler // nil: no adapter
	}{
		{name: "bare"},
		{name: "otel-sampled", sampler: sdktrace.AlwaysSample()},
		{name: "otel-unsampled", sampler: sdktrace.NeverSample()},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			opts := []broker.Option{broker.WithLogger(slog.New(slog.DiscardHandler)), broker.WithPublishTimeout(time.Minute)}
			if c.sampler != nil {
				// As in production: spans go through a batching processor
				// (blocking, so none is dropped and every span is paid for)
				// and metrics aggregate in an SDK MeterProvider.
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(c.sampler),
					sdktrace.WithBatcher(discard{}, sdktrace.WithBlocking()))
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				b.Cleanup(func() {
					_ = tp.Shutdown(context.Background())
					_ = mp.Shutdown(context.Background())
				})
				tel, err := brokerotel.New(brokerotel.Options{TracerProvider: tp, MeterProvider: mp})
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, tel.Options()...)
			}
			ids := make([]string, benchMessages)
			for i := range ids {
				ids[i] = fmt.Sprintf("msg-%d", i)
			}
			payload := make([]byte, 64)
			var total cell
			for range b.N {
				c := runW1(b, opts, ids, payload)
				total.elapsed += c.elapsed
				total.cpu += c.cpu
				total.mallocs += c.mallocs
				total.bytes += c.bytes
			}
			n := float64(b.N * benchMessages)
			b.ReportMetric(float64(total.elapsed.Nanoseconds())/n, "ns/msg")
			b.ReportMetric(float64(total.cpu.Nanoseconds())/n, "cpu-ns/msg")
			b.ReportMetric(float64(total.mallocs)/n, "allocs/msg")
			b.ReportMetric(float64(total.bytes)/n, "B/msg")
		})
	}
}

// cell is what one run measured, from the first publish to the last
// delivery.
type cell struct {
	elapsed, cpu   time.Duration // wall clock; CPU time of the whole process
	mallocs, bytes uint64
}

// runW1 runs one cell on a fresh broker.
func runW1(b *testing.B, opts []broker.Option, ids []string, payload []byte) cell {
	b.StopTimer()
	defer b.StartTimer()
	br, err := broker.New(opts...)
	if err != nil {
		b.Fatal(err)
	}
	var handled atomic.Int64
	done := make(chan struct{})
	_, err = br.Subscribe("w1", "sub", func(context.Context, broker.Message) error {
		if handled.Add(1) == int64(len(ids)) {
			close(done)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.StartTimer()
	start, cpu := time.Now(), cpuTime()
	ctx := context.Background()
	for _, id := range ids {
		if err := br.Publish(ctx, broker.Message{ID: id, Topic: "w1", Payload: payload}); err != nil {
			b.Fatal(err)
		}
	}
	<-done
	c := cell{elapsed: time.Since(start), cpu: cpuTime() - cpu}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	c.mallocs, c.bytes = after.Mallocs-before.Mallocs, after.TotalAlloc-before.TotalAlloc
	if err := br.Close(ctx); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkParts measures the adapter's own calls, without a broker: the
// publish hook, one attempt through the middleware, and the observer's
// events for a delivered message (through the Telemetry's own hooks and
// through those ForSubscriber returns).
func BenchmarkParts(b *testing.B) {
	for _, c := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"sampled", sdktrace.AlwaysSample()}, {"unsampled", sdktrace.NeverSample()}} {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(c.sampler), sdktrace.WithBatcher(discard{}, sdktrace.WithBlocking()))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() {
			_ = tp.Shutdown(context.Background())
			_ = mp.Shutdown(context.Background())
		})
		tel, err := brokerotel.New(brokerotel.Options{TracerProvider: tp, MeterProvider: mp})
		if err != nil {
			b.Fatal(err)
		}
		payload := make([]byte, 64)
		b.Run(c.name+"/hook", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				msg := broker.Message{ID: "msg-1", Topic: "w1", Payload: payload, Headers: make(map[string]string, 2)}
				_ = tel.PublishHook(ctx, &msg)
			}
		})
		msg := broker.Message{ID: "msg-1", Topic: "w1", Payload: payload, Headers: map[string]string{}, Attempt: 1}
		_ = tel.PublishHook(context.Background(), &msg)
		b.Run(c.name+"/middleware", func(b *testing.B) {
			h := tel.Middleware(broker.SubscriberInfo{Topic: "w1", Name: "sub"}, func(context.Context, broker.Message) error { return nil })
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				_ = h(ctx, msg)
			}
		})
		// The observer's events for a delivered message: through the
		// Telemetry's own hooks (which look the subscriber's sets up), and
		// through the subscriber's hooks ForSubscriber returns (which the
		// broker uses).
		for _, hooks := range []struct {
			name string
			o    broker.Observer
		}{{"observer", tel}, {"observer-for-subscriber", tel.ForSubscriber("w1", "sub")}} {
			b.Run(c.name+"/"+hooks.name, func(b *testing.B) {
				b.ReportAllocs()
				now := time.Now()
				for b.Loop() {
					tel.Published(broker.PublishEvent{Topic: "w1", MessageID: "msg-1", PublishedAt: now})
					hooks.o.Attempted(broker.AttemptEvent{Topic: "w1", Subscriber: "sub", MessageID: "msg-1", Attempt: 1,
						Outcome: broker.OutcomeDelivered, PublishedAt: now})
				}
			})
		}
	}
}
