package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// restartable is an embedded server with a port that a test stops and
// starts again on the same port and directory.
type restartable struct {
	dir  string
	port int
	srv  *natsjs.Conn
}

func newRestartable(t *testing.T) *restartable {
	t.Helper()
	r := &restartable{dir: t.TempDir()}
	srv, err := natsjs.Embedded(r.dir, natsjs.Listen("127.0.0.1", 0))
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	u, err := url.Parse(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	r.port, _ = strconv.Atoi(u.Port())
	r.srv = srv
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *restartable) url() string { return "nats://127.0.0.1:" + strconv.Itoa(r.port) }

// stop shuts the server down (graceful: pulls get 409 Server Shutdown).
func (r *restartable) stop(t *testing.T) {
	t.Helper()
	if r.srv != nil {
		closeConn(t, r.srv)
		r.srv = nil
	}
}

// start starts it again on the same port and directory.
func (r *restartable) start(t *testing.T) {
	t.Helper()
	srv, err := natsjs.Embedded(r.dir, natsjs.Listen("127.0.0.1", r.port))
	if err != nil {
		t.Fatalf("Embedded again: %v", err)
	}
	r.srv = srv
}

// client connects to the server, reconnecting every 20 ms (plus opts).
func (r *restartable) client(t *testing.T, opts ...nats.Option) *natsjs.Conn {
	t.Helper()
	c, err := natsjs.Connect(r.url(), append([]nats.Option{nats.ReconnectWait(20 * time.Millisecond), nats.ReconnectJitter(0, 0)}, opts...)...)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { closeConn(t, c) })
	return c
}

// seqOf returns the stream sequence in a dead letter's ID
// ("<stream>.<sequence>.<stored at>.<subscriber>").
func seqOf(t *testing.T, stream, id string) string {
	t.Helper()
	rest, ok := strings.CutPrefix(id, stream+".")
	seq, _, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		t.Fatalf("dead letter ID %q is not <%s>.<sequence>....", id, stream)
	}
	return seq
}

// TestDeadLetterIDsAcrossStreamLives: stream sequences start again at 1
// when a memory stream is lost in a server restart, or when a stream is
// deleted and the transport creates it again. Dead letters of the earlier
// life stay in the store; a new message at a reused sequence that fails
// once is retried and delivered (not taken for the old dead letter and
// terminated unrun), one that keeps failing is dead-lettered under an ID
// of its own, and the old dead letters are all still there, unchanged.
func TestDeadLetterIDsAcrossStreamLives(t *testing.T) {
	tests := []struct {
		name    string
		storage jetstream.StorageType
		reset   string // "restart" or "delete"
	}{
		{"memory stream, server restart", jetstream.MemoryStorage, "restart"},
		{"memory stream, deleted and created again", jetstream.MemoryStorage, "delete"},
		{"file stream, deleted and created again", jetstream.FileStorage, "delete"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRestartable(t)
			conn := srv.client(t)
			r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithPartitions(1), natsjs.WithStreamStorage(tt.storage)})
			const topic = "lives"
			stream := r.tr.StreamName(topic)
			var mu sync.Mutex
			delivered := map[string][]int{} // ID → attempts that succeeded
			ran := map[string][]int{}       // ID → attempts run
			r.subscribe(t, topic, "s", func(_ context.Context, m broker.Message) error {
				mu.Lock()
				defer mu.Unlock()
				ran[m.ID] = append(ran[m.ID], m.Attempt)
				switch {
				case strings.HasPrefix(m.ID, "bad"):
					return codeErr{"db"}
				case strings.HasPrefix(m.ID, "flaky") && m.Attempt == 1:
					return errors.New("flaky")
				}
				delivered[m.ID] = append(delivered[m.ID], m.Attempt)
				return nil
			})
			isDelivered := func(id string) func() bool {
				return func() bool {
					mu.Lock()
					defer mu.Unlock()
					return len(delivered[id]) > 0
				}
			}

			// The first life: old dead letters at sequences 1..n.
			const n = 8
			for i := range n {
				r.publish(t, broker.Message{ID: fmt.Sprintf("bad-old-%d", i), Topic: topic, Key: "k"})
			}
			var old []broker.DeadLetter
			waitFor(t, "the old messages dead-lettered", func() bool {
				dls, err := r.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: topic})
				old = dls
				return err == nil && len(dls) == n
			})
			oldSeqs := map[string]bool{}
			for _, dl := range old {
				oldSeqs[seqOf(t, stream, dl.ID)] = true
			}

			switch tt.reset {
			case "restart":
				srv.stop(t)
				srv.start(t)
				waitFor(t, "the client to reconnect", conn.NATS().IsConnected)
			case "delete":
				if err := conn.JetStream().DeleteStream(t.Context(), stream); err != nil {
					t.Fatalf("DeleteStream: %v", err)
				}
			}
			// The transport creates the stream again at the next publish,
			// the subscriber its consumer: until both exist, a message is
			// refused or not kept (interest retention).
			for i := 0; ; i++ {
				id := fmt.Sprintf("probe-%d", i)
				if err := r.b.Publish(t.Context(), broker.Message{ID: id, Topic: topic, Key: "k"}); err != nil && i%10 == 0 {
					t.Logf("probe %d: %v", i, err)
				}
				deadline := time.Now().Add(500 * time.Millisecond)
				for !isDelivered(id)() && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if isDelivered(id)() {
					break
				}
				if i == 40 {
					t.Fatal("the subscriber did not resume after the stream's reset")
				}
			}

			r.publish(t, broker.Message{ID: "flaky-new", Topic: topic, Key: "k"})
			r.publish(t, broker.Message{ID: "bad-new", Topic: topic, Key: "k"})
			waitFor(t, "the new flaky message delivered on its retry", isDelivered("flaky-new"))
			var fresh broker.DeadLetter
			waitFor(t, "the new failing message dead-lettered", func() bool {
				dls, err := r.dlq.List(t.Context(), broker.DeadLetterFilter{Topic: topic})
				for _, dl := range dls {
					if dl.Message.ID == "bad-new" {
						fresh = dl
					}
				}
				return err == nil && fresh.ID != ""
			})
			if !oldSeqs[seqOf(t, stream, fresh.ID)] {
				t.Fatalf("bad-new stored at sequence %s, which no old dead letter has: the test did not reuse a sequence", seqOf(t, stream, fresh.ID))
			}
			mu.Lock()
			if got := ran["bad-new"]; len(got) != 3 || fresh.Attempts != 3 || fresh.Reason != broker.ReasonExhausted {
				t.Errorf("bad-new ran attempts %v, dead letter %+v: want 3 attempts, exhausted", got, fresh)
			}
			if got := ran["flaky-new"]; len(got) != 2 {
				t.Errorf("flaky-new ran attempts %v, want [1 2]", got)
			}
			mu.Unlock()
			for _, dl := range old {
				got, ok, err := r.dlq.Get(t.Context(), dl.ID)
				if err != nil || !ok || got.Message.ID != dl.Message.ID || !got.FailedAt.Equal(dl.FailedAt) {
					t.Errorf("old dead letter %q: got %+v, %v, %v; want it unchanged (message %q)", dl.ID, got, ok, err, dl.Message.ID)
				}
				if dl.ID == fresh.ID {
					t.Errorf("the new dead letter has an old one's ID %q", dl.ID)
				}
			}
			if n, err := r.dlq.Len(t.Context()); err != nil || n != len(old)+1 {
				t.Errorf("dead letters stored: %d (%v), want %d", n, err, len(old)+1)
			}
		})
	}
}

// TestLegacyDeadLetterIDs: dead letters stored under the IDs earlier
// versions gave ("<stream>.<sequence>.<subscriber>") keep working. A
// message stored before the transport started whose dead letter is there
// under that ID is terminated without running (as before); one whose
// legacy ID holds another message's dead letter (an earlier life of the
// stream) runs. The legacy dead letter reads and redrives as any.
func TestLegacyDeadLetterIDs(t *testing.T) {
	conn := embedded(t, "")
	const topic = "legacy"
	// A first broker creates the subscriber's consumer and leaves.
	first := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithPartitions(1)})
	s := first.subscribe(t, topic, "s", func(context.Context, broker.Message) error { return nil })
	if err := s.Unsubscribe(t.Context()); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	// Two messages wait in the stream: sequences 1 and 2.
	first.publish(t, broker.Message{ID: "fresh", Topic: topic, Key: "k"})
	first.publish(t, broker.Message{ID: "dead", Topic: topic, Key: "k"})
	stream := first.tr.StreamName(topic)
	js := conn.JetStream()
	st, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := st.GetMsg(t.Context(), 2)
	if err != nil {
		t.Fatalf("GetMsg(2): %v", err)
	}
	publishedAt, err := time.Parse(time.RFC3339Nano, raw.Header.Get("Broker-Published-At"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	legacy := []broker.DeadLetter{
		{ // sequence 1, another message's (an earlier life of the stream)
			ID: stream + ".1.s", Message: broker.Message{ID: "other", Topic: topic, Key: "k", Attempt: 3, PublishedAt: now.Add(-time.Hour)},
			Subscriber: "s", Attempts: 3, ErrorCode: "db", Error: "failed", Retryable: true, Reason: broker.ReasonExhausted, FailedAt: now.Add(-time.Hour),
		},
		{ // sequence 2, this message's: dead-lettered by an earlier version, which died before terminating it
			ID: stream + ".2.s", Message: broker.Message{ID: "dead", Topic: topic, Key: "k", Attempt: 3, PublishedAt: publishedAt},
			Subscriber: "s", Attempts: 3, ErrorCode: "db", Error: "failed", Retryable: true, Reason: broker.ReasonExhausted, FailedAt: now,
		},
	}
	for _, dl := range legacy {
		if err := first.dlq.Put(t.Context(), dl); err != nil {
			t.Fatalf("Put(%q): %v", dl.ID, err)
		}
	}

	// The new version starts after both were stored.
	r := newRig(t, conn, false, []natsjs.TransportOption{natsjs.WithPartitions(1)})
	c := &calls{}
	r.subscribe(t, topic, "s", c.handler("", nil))
	waitFor(t, "the fresh message delivered", func() bool { return len(c.of("fresh")) == 1 })
	waitFor(t, "the stream to let both go", func() bool { return r.streamMsgs(t, topic) == 0 })
	if got := c.of("dead"); len(got) != 0 {
		t.Errorf("the dead-lettered message ran %d times, want 0 (its legacy dead letter is stored)", len(got))
	}
	for _, dl := range legacy {
		got, ok, err := r.dlq.Get(t.Context(), dl.ID)
		if err != nil || !ok || got.Message.ID != dl.Message.ID {
			t.Errorf("Get(%q) = %+v, %v, %v; want the legacy dead letter", dl.ID, got, ok, err)
		}
	}
	if n, err := r.dlq.Len(t.Context()); err != nil || n != 2 {
		t.Errorf("dead letters stored: %d (%v), want the 2 legacy ones", n, err)
	}
	n, err := r.b.Redrive(t.Context(), legacy[1].ID)
	if err != nil || n != 1 {
		t.Fatalf("Redrive(%q) = %d, %v", legacy[1].ID, n, err)
	}
	waitFor(t, "the redriven legacy dead letter delivered", func() bool { return len(c.of("dead")) == 1 })
	if ok := func() bool { _, ok, _ := r.dlq.Get(t.Context(), legacy[1].ID); return ok }(); ok {
		t.Errorf("the redriven dead letter %q is still stored", legacy[1].ID)
	}
}
