package natsjs_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
)

// Cost of each store call against an embedded server (in-process
// connection, file storage): go test -run '^$' -bench . -benchtime 2000x

func BenchmarkDeadLetterPut(b *testing.B) {
	conn, err := natsjs.Embedded(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(b.Context())
	s, err := natsjs.NewDeadLetterStore(b.Context(), conn.JetStream())
	if err != nil {
		b.Fatal(err)
	}
	dl := broker.DeadLetter{Message: broker.Message{ID: "m", Topic: "orders", Payload: make([]byte, 256)}, Subscriber: "billing", ErrorCode: "timeout"}
	b.ResetTimer()
	for i := range b.N {
		dl.ID = fmt.Sprintf("dl-%d", i)
		if err := s.Put(b.Context(), dl); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkIdempotency(b *testing.B) {
	conn, err := natsjs.Embedded(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(b.Context())
	s, err := natsjs.NewIdempotencyStore(b.Context(), conn.JetStream())
	if err != nil {
		b.Fatal(err)
	}
	k := broker.DeliveryKey{Topic: "orders", Subscriber: "billing"}
	b.Run("Record", func(b *testing.B) {
		for i := range b.N {
			k.MessageID = fmt.Sprintf("m-%d", i)
			if err := s.Record(b.Context(), k); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Seen", func(b *testing.B) {
		for i := range b.N {
			k.MessageID = fmt.Sprintf("m-%d", i)
			if _, err := s.Seen(b.Context(), k); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDurableDefault measures the durable default end to end: Open on
// a temporary directory (embedded server, file storage, the stream
// dead-letter and KV dedup stores), one subscriber, b.N messages of 128
// bytes published by 16 goroutines at once (a Publish waits for the
// server's acknowledgement) and delivered. msgs/s counts messages
// published and delivered per second of the whole run.
//
//	go test -run '^$' -bench DurableDefault -benchtime 10000x -count 3 .
func BenchmarkDurableDefault(b *testing.B) {
	for _, bc := range []struct {
		name        string
		partitions  int
		concurrency int
		noDedup     bool
	}{
		{"default", 1, 1, false},
		{"partitions=4,concurrency=4", 4, 4, false},
		{"partitions=4,concurrency=4,no_kv_dedup", 4, 4, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			br, err := natsjs.Open(b.TempDir(), natsjs.Config{
				Transport: []natsjs.TransportOption{natsjs.WithPartitions(bc.partitions)},
				NoDedup:   bc.noDedup,
				Logger:    slog.New(slog.DiscardHandler),
			})
			if err != nil {
				b.Fatal(err)
			}
			defer br.Close(context.Background())
			var delivered atomic.Int64
			done := make(chan struct{})
			n := int64(b.N)
			_, err = br.Subscribe("bench", "s", func(context.Context, broker.Message) error {
				if delivered.Add(1) == n {
					close(done)
				}
				return nil
			}, broker.Concurrency(bc.concurrency))
			if err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, 128)
			const publishers = 16
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for p := range publishers {
				wg.Go(func() {
					for i := p; i < b.N; i += publishers {
						m := broker.Message{ID: strconv.Itoa(i), Topic: "bench", Key: strconv.Itoa(i % 64), Payload: payload}
						if err := br.Publish(context.Background(), m); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			select {
			case <-done:
			case <-time.After(5 * time.Minute):
				b.Fatalf("%d of %d delivered after 5 minutes", delivered.Load(), b.N)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
