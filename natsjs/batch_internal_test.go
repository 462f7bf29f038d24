package natsjs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readyFuture is a PubAckFuture whose acknowledgement has arrived.
type readyFuture struct{ ok chan *jetstream.PubAck }

func (f readyFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f readyFuture) Err() <-chan error            { return nil }
func (f readyFuture) Msg() *nats.Msg               { return nil }

func acked() readyFuture {
	f := readyFuture{ok: make(chan *jetstream.PubAck, 1)}
	f.ok <- &jetstream.PubAck{Stream: "S", Sequence: 1}
	return f
}

// TestSettleTakesAnAnswerThere: a message whose acknowledgement has
// arrived is stored; settle says so whether or not its deadline has passed
// by the time it is looked at (a batch that waited for earlier full-stream
// refusals), or ctx has ended meanwhile.
func TestSettleTakesAnAnswerThere(t *testing.T) {
	tr := &Transport{}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		at   time.Time
	}{
		{"deadline passed", context.Background(), time.Now().Add(-time.Minute)},
		{"ctx ended", done, time.Now()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wrong := 0
			var last error
			for i := range 40 {
				s := sentMsg{i: i, id: fmt.Sprint(i), ts: &topicState{stream: "S"}, at: tc.at, f: acked()}
				timer := stoppedTimer()
				if err := tr.settle(tc.ctx, &s, &fullWait{}, timer); err != nil {
					wrong++
					last = err
				}
			}
			if wrong > 0 {
				t.Errorf("%d of 40 acknowledged messages reported not stored, e.g. %v", wrong, last)
			}
		})
	}
}
