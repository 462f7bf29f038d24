package natsjs_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/inproc/broker"
	"github.com/inproc/broker/natsjs"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEmbeddedOpensNoPort(t *testing.T) {
	conn := embedded(t, "")
	if u := conn.ClientURL(); u != "" {
		t.Errorf("ClientURL = %q, want \"\" (no port)", u)
	}
	if a := conn.Server().Addr(); a != nil {
		t.Errorf("server listens on %v, want no listener", a)
	}
	// JetStream works over the in-process connection, with file storage.
	js := conn.JetStream()
	s, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	if err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
	if st := s.CachedInfo().Config.Storage; st != jetstream.FileStorage {
		t.Errorf("default storage = %v, want file", st)
	}
	if _, err := js.Publish(t.Context(), "s.1", []byte("hi")); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if m, err := s.GetLastMsgForSubject(t.Context(), "s.1"); err != nil || string(m.Data) != "hi" {
		t.Fatalf("GetLastMsgForSubject = %v, %v", m, err)
	}
}

// TestStoresSharedByReplicas: two connections to one server, as two
// replicas of a service would have, see each other's dead letters and
// dedup records.
func TestStoresSharedByReplicas(t *testing.T) {
	a := embedded(t, "", natsjs.Listen("127.0.0.1", 0))
	if a.ClientURL() == "" {
		t.Fatal("ClientURL is empty with Listen")
	}
	b, err := natsjs.Connect(a.ClientURL())
	if err != nil {
		t.Fatalf("Connect(%s): %v", a.ClientURL(), err)
	}
	t.Cleanup(func() { closeConn(t, b) }) // before a's: cleanups run last first
	if b.Server() != nil || b.ClientURL() != a.ClientURL() {
		t.Errorf("Connect's Conn: Server %v, ClientURL %q; want nil, %q", b.Server(), b.ClientURL(), a.ClientURL())
	}
	ctx := t.Context()
	dlqA, dedupA := stores(t, a)
	dlqB, dedupB := stores(t, b)
	dl := broker.DeadLetter{ID: "dl-1", Message: broker.Message{ID: "m1", Topic: "orders"}, Subscriber: "billing", ErrorCode: "timeout"}
	if err := dlqA.Put(ctx, dl); err != nil {
		t.Fatalf("Put on A: %v", err)
	}
	if got, ok, err := dlqB.Get(ctx, "dl-1"); err != nil || !ok || got.Message.ID != "m1" {
		t.Errorf("Get on B = %+v, %v, %v; want the dead letter put on A", got, ok, err)
	}
	k := broker.DeliveryKey{Topic: "orders", Subscriber: "billing", MessageID: "m1"}
	if err := dedupB.Record(ctx, k); err != nil {
		t.Fatalf("Record on B: %v", err)
	}
	if ok, err := dedupA.Seen(ctx, k); err != nil || !ok {
		t.Errorf("Seen on A = %v, %v; want true (recorded on B)", ok, err)
	}
}

// TestServerRestartClientReconnects: a client connected by URL outlives a
// restart of the embedded server on the same port and directory, and finds
// the stores as they were.
func TestServerRestartClientReconnects(t *testing.T) {
	dir := t.TempDir()
	srv1, err := natsjs.Embedded(dir, natsjs.Listen("127.0.0.1", 0))
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	u, err := url.Parse(srv1.ClientURL())
	if err != nil {
		t.Fatalf("ClientURL %q: %v", srv1.ClientURL(), err)
	}
	port, _ := strconv.Atoi(u.Port())
	client, err := natsjs.Connect(srv1.ClientURL(), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { closeConn(t, client) })
	ctx := t.Context()
	dlq, _ := stores(t, client)
	if err := dlq.Put(ctx, broker.DeadLetter{ID: "before", Message: broker.Message{ID: "m", Topic: "t"}, Subscriber: "s"}); err != nil {
		t.Fatalf("Put: %v", err)
	}
	closeConn(t, srv1)
	waitFor(t, "the client to notice the server is gone", func() bool { return !client.NATS().IsConnected() })

	embedded(t, dir, natsjs.Listen("127.0.0.1", port))
	waitFor(t, "the client to reconnect", client.NATS().IsConnected)
	if _, ok, err := dlq.Get(ctx, "before"); err != nil || !ok {
		t.Errorf("Get after the restart = %v, %v; want the dead letter put before", ok, err)
	}
	if err := dlq.Put(ctx, broker.DeadLetter{ID: "after", Message: broker.Message{ID: "m", Topic: "t"}, Subscriber: "s"}); err != nil {
		t.Errorf("Put after the restart: %v", err)
	}
	if n, err := dlq.Len(ctx); n != 2 || err != nil {
		t.Errorf("Len = %d, %v; want 2", n, err)
	}
}

func TestCloseIsIdempotentAndStopsTheServer(t *testing.T) {
	for _, c := range []struct {
		name string
		ctx  func() context.Context
	}{
		{"live context", context.Background},
		{"cancelled context", func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := natsjs.Embedded(t.TempDir())
			if err != nil {
				t.Fatalf("Embedded: %v", err)
			}
			if _, err := conn.JetStream().CreateStream(t.Context(), jetstream.StreamConfig{Name: "S"}); err != nil {
				t.Fatalf("CreateStream: %v", err)
			}
			err1 := conn.Close(c.ctx())
			// A cancelled context may cut the drain short (an error
			// matching context.Canceled) or find it already done.
			if err1 != nil && !errors.Is(err1, context.Canceled) {
				t.Errorf("Close = %v", err1)
			}
			if err2 := conn.Close(context.Background()); err2 != err1 {
				t.Errorf("second Close = %v, want the first's %v", err2, err1)
			}
			if !conn.NATS().IsClosed() {
				t.Errorf("connection not closed")
			}
			if conn.Server().Running() {
				t.Errorf("server still running after Close")
			}
			// goleak (TestMain) checks that nothing of the server lingers.
		})
	}
}

// TestOneServerPerDir: a directory an embedded server has open is refused
// to a second one (Embedded and Open) with ErrDirInUse, so two servers
// never write the same files; Close frees it, and a lock file left by a
// process that died does not hold it (the kernel dropped its lock).
func TestOneServerPerDir(t *testing.T) {
	dir := t.TempDir()
	first, err := natsjs.Embedded(dir)
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	if c, err := natsjs.Embedded(dir); !errors.Is(err, natsjs.ErrDirInUse) {
		if c != nil {
			closeConn(t, c)
		}
		t.Fatalf("a second Embedded of the same dir = %v; want ErrDirInUse", err)
	}
	if b, err := natsjs.Open(dir, natsjs.Config{}); !errors.Is(err, natsjs.ErrDirInUse) {
		if b != nil {
			_ = b.Close(context.Background())
		}
		t.Fatalf("Open of a dir in use = %v; want ErrDirInUse", err)
	}
	closeConn(t, first)
	again := embedded(t, dir) // free once the first closed (its lock file stays)
	closeConn(t, again)

	other := t.TempDir() // a lock file without a lock: a process that died
	if err := os.WriteFile(filepath.Join(other, ".natsjs.lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	embedded(t, other)
}

func TestEmbeddedOptions(t *testing.T) {
	var seen *server.Options
	conn := embedded(t, "", natsjs.WithServerOptions(func(o *server.Options) {
		o.ServerName = "custom-name"
		o.JetStream = false // Embedded turns it back on
		seen = o
	}), natsjs.WithReadyTimeout(5*time.Second), natsjs.WithConnectOptions(nats.Name("custom-client")))
	if seen == nil || conn.Server().Name() != "custom-name" {
		t.Errorf("server name %q, want custom-name from WithServerOptions", conn.Server().Name())
	}
	if !conn.Server().JetStreamEnabled() {
		t.Errorf("JetStream disabled by WithServerOptions; Embedded must keep it on")
	}
	if got := conn.NATS().Opts.Name; got != "custom-client" {
		t.Errorf("client name %q, want custom-client from WithConnectOptions", got)
	}
}

func TestBadInput(t *testing.T) {
	for _, c := range []struct {
		name string
		err  func() error
	}{
		{"Embedded without dir", func() error { _, err := natsjs.Embedded(""); return err }},
		{"negative port", func() error { _, err := natsjs.Embedded(t.TempDir(), natsjs.Listen("127.0.0.1", -1)); return err }},
		{"port too big", func() error { _, err := natsjs.Embedded(t.TempDir(), natsjs.Listen("127.0.0.1", 70000)); return err }},
		{"zero ready timeout", func() error { _, err := natsjs.Embedded(t.TempDir(), natsjs.WithReadyTimeout(0)); return err }},
		{"nil server options", func() error { _, err := natsjs.Embedded(t.TempDir(), natsjs.WithServerOptions(nil)); return err }},
		{"Connect without URL", func() error { _, err := natsjs.Connect(""); return err }},
		{"dead-letter store without JetStream", func() error {
			_, err := natsjs.NewDeadLetterStore(context.Background(), nil)
			return err
		}},
		{"idempotency store without JetStream", func() error {
			_, err := natsjs.NewIdempotencyStore(context.Background(), nil)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.err(); !errors.Is(err, natsjs.ErrInvalidOption) {
				t.Errorf("err = %v, want ErrInvalidOption", err)
			}
		})
	}
}

func TestStoreOptions(t *testing.T) {
	js := embedded(t, "").JetStream()
	ctx := t.Context()
	dlq := func(opts ...natsjs.Option) error { _, err := natsjs.NewDeadLetterStore(ctx, js, opts...); return err }
	dedup := func(opts ...natsjs.Option) error { _, err := natsjs.NewIdempotencyStore(ctx, js, opts...); return err }
	for _, c := range []struct {
		name string
		err  error
	}{
		{"stream name with a dot", dlq(natsjs.WithStream("a.b"))},
		{"empty stream name", dlq(natsjs.WithStream(""))},
		{"wildcard prefix", dlq(natsjs.WithSubjectPrefix("brk.*"))},
		{"empty prefix token", dlq(natsjs.WithSubjectPrefix("brk..dlq"))},
		{"zero replicas", dlq(natsjs.WithReplicas(0))},
		{"bad storage", dlq(natsjs.WithStorage(jetstream.StorageType(7)))},
		{"window on the dead-letter store", dlq(natsjs.WithWindow(time.Minute))},
		{"bucket on the dead-letter store", dlq(natsjs.WithBucket("B"))},
		{"stream on the idempotency store", dedup(natsjs.WithStream("S"))},
		{"prefix on the idempotency store", dedup(natsjs.WithSubjectPrefix("p"))},
		{"max dead letters on the idempotency store", dedup(natsjs.WithMaxDeadLetters(3))},
		{"window below the minimum", dedup(natsjs.WithWindow(10 * time.Millisecond))},
		{"bucket with a space", dedup(natsjs.WithBucket("my bucket"))},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !errors.Is(c.err, natsjs.ErrInvalidOption) {
				t.Errorf("err = %v, want ErrInvalidOption", c.err)
			}
		})
	}

	t.Run("valid options", func(t *testing.T) {
		d, err := natsjs.NewDeadLetterStore(ctx, js, natsjs.WithStream("MY_DLQ"), natsjs.WithSubjectPrefix("my.dlq"),
			natsjs.WithStorage(jetstream.MemoryStorage), natsjs.WithReplicas(1), natsjs.WithMaxDeadLetters(10), nil)
		if err != nil {
			t.Fatalf("NewDeadLetterStore: %v", err)
		}
		info, err := js.Stream(ctx, "MY_DLQ")
		if err != nil {
			t.Fatalf("Stream: %v", err)
		}
		cfg := info.CachedInfo().Config
		if d.Stream() != "MY_DLQ" || cfg.Subjects[0] != "my.dlq.>" || cfg.Storage != jetstream.MemoryStorage || cfg.MaxMsgs != 10 {
			t.Errorf("stream %q config: subjects %q, storage %v, max msgs %d", d.Stream(), cfg.Subjects, cfg.Storage, cfg.MaxMsgs)
		}
		k, err := natsjs.NewIdempotencyStore(ctx, js, natsjs.WithBucket("MY_DEDUP"), natsjs.WithWindow(time.Minute))
		if err != nil {
			t.Fatalf("NewIdempotencyStore: %v", err)
		}
		kv, err := js.KeyValue(ctx, "MY_DEDUP")
		if err != nil {
			t.Fatalf("KeyValue: %v", err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		if k.Bucket() != "MY_DEDUP" || k.Window() != time.Minute || st.TTL() != time.Minute || st.History() != 1 {
			t.Errorf("bucket %q window %v: TTL %v, history %d", k.Bucket(), k.Window(), st.TTL(), st.History())
		}
		// Opening again with the same options finds the same stream and bucket.
		if _, err := natsjs.NewDeadLetterStore(ctx, js, natsjs.WithStream("MY_DLQ"), natsjs.WithSubjectPrefix("my.dlq"),
			natsjs.WithStorage(jetstream.MemoryStorage), natsjs.WithMaxDeadLetters(10)); err != nil {
			t.Errorf("reopening the stream: %v", err)
		}
	})
}
