package natsjs_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/inproc/broker/natsjs"
)

// embedded starts an embedded server in dir (a new temporary one if
// empty) and closes it when the test ends.
func embedded(t *testing.T, dir string, opts ...natsjs.EmbedOption) *natsjs.Conn {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	c, err := natsjs.Embedded(dir, opts...)
	if err != nil {
		t.Fatalf("Embedded: %v", err)
	}
	t.Cleanup(func() { closeConn(t, c) })
	return c
}

func closeConn(t *testing.T, c *natsjs.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10s waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var discardLogger = slog.New(slog.DiscardHandler)
