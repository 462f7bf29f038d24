package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example serves metrics and the admin page with live traffic, and
// stops cleanly when its context ends.
func TestServesMetricsAndAdmin(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	require.NoError(t, err)
	defer devnull.Close()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, 500, devnull) }()

	base := "http://" + ln.Addr().String()
	get := func(path string) string {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(body)
	}
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return strings.Contains(get("/metrics"), `subscriber="billing"`)
	}, 10*time.Second, 50*time.Millisecond, "metrics for the subscribers")
	// The admin page samples in the background: its first visit, 3 s in,
	// finds a chart with a history (one sample, without the sampler).
	time.Sleep(3 * time.Second)
	var snap struct {
		Topics []struct {
			Name  string `json:"name"`
			Chart struct {
				Samples []json.RawMessage `json:"samples"`
			} `json:"chart"`
		} `json:"topics"`
	}
	require.NoError(t, json.Unmarshal([]byte(get("/admin/api/stats")), &snap))
	require.NotEmpty(t, snap.Topics)
	for _, tp := range snap.Topics {
		assert.GreaterOrEqual(t, len(tp.Chart.Samples), 3, "topic %s: samples at the first visit", tp.Name)
	}
	metrics := get("/metrics")
	for _, want := range []string{`topic="orders"`, `topic="payments"`, "go_goroutines"} {
		assert.Contains(t, metrics, want)
	}
	page := get("/admin/")
	for _, want := range []string{"orders", "payments", "billing", "card"} {
		assert.Contains(t, page, want)
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not return after its context ended")
	}
	http.DefaultClient.CloseIdleConnections()
}
