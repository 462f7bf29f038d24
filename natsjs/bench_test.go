package natsjs_test

import (
	"fmt"
	"testing"

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
