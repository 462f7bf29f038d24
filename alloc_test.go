package broker

import (
	"context"
	"strconv"
	"testing"
)

// TestAllocations pins the hot path's allocations: Publish of a message
// without Headers allocates nothing, and a delivery on the success path at
// most once per subscriber (the default dedup store's map growth).
func TestAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ids := make([]string, 2000)
	for i := range ids {
		ids[i] = "m-" + strconv.Itoa(i)
	}
	tests := []struct {
		name   string
		opts   []Option
		subs   int
		wanted float64
	}{
		{"publish, no subscriber", nil, 0, 0},
		{"publish and deliver, dedup off", []Option{WithIdempotencyStore(nil)}, 1, 0},
		{"publish and deliver to 4, dedup off", []Option{WithIdempotencyStore(nil)}, 4, 0},
		{"publish and deliver, default dedup", nil, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(append([]Option{WithLogger(discard)}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close(context.Background())
			done := make(chan struct{}, 1024)
			for i := range tt.subs {
				if _, err := b.Subscribe("t", "s"+strconv.Itoa(i), func(context.Context, Message) error {
					done <- struct{}{}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			payload := make([]byte, 64)
			ctx := context.Background()
			i := 0
			publish := func() {
				if err := b.Publish(ctx, Message{ID: ids[i], Topic: "t", Payload: payload}); err != nil {
					t.Fatal(err)
				}
				i++
				for range tt.subs {
					<-done
				}
			}
			publish() // warm up: the topic and its dispatcher are created once
			if got := testing.AllocsPerRun(1000, publish); got > tt.wanted {
				t.Errorf("%.2f allocations per message, want at most %v", got, tt.wanted)
			}
		})
	}
}
