package natsjs

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/inproc/broker"
)

// TestPutTooLargeWithItsHeaders: a dead letter whose encoding fits the
// server's max_payload by itself but not with the publish's headers is
// ErrTooLarge too (a refusal the broker does not retry), not a plain error.
func TestPutTooLargeWithItsHeaders(t *testing.T) {
	conn, err := Embedded(t.TempDir())
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	defer conn.Close(context.Background())
	ctx := t.Context()
	s, err := NewDeadLetterStore(ctx, conn.JetStream())
	if err != nil {
		t.Fatalf("NewDeadLetterStore: %v", err)
	}
	maxp := conn.NATS().MaxPayload()
	dl := broker.DeadLetter{ID: "big", Message: broker.Message{ID: "m", Topic: "t"}, Subscriber: "s"}
	size := func(n int) int64 {
		dl.Message.Payload = make([]byte, n)
		data, err := json.Marshal(toRecord(&dl))
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(data))
	}
	// The largest payload whose encoded dead letter is at most max_payload
	// (base64: 4 bytes for every 3).
	n := int(maxp) * 3 / 4
	for over := size(n) - maxp; over > 0; over = size(n) - maxp {
		n -= int(over*3/4) + 1
	}
	if err := s.Put(ctx, dl); !errors.Is(err, ErrTooLarge) || !errors.Is(err, broker.ErrDeadLetterRefused) {
		t.Errorf("Put of a dead letter of %d bytes encoded (max payload %d) = %v, want ErrTooLarge", size(n), maxp, err)
	}
}
