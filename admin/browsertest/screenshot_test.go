package browsertest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
	"github.com/inproc/broker/admin/browsertest"
)

// screenshotDir is where the screenshots go: the repository's docs folder
// with BROKER_SCREENSHOTS=1 (to commit them), else a temporary folder.
func screenshotDir(t *testing.T) string {
	t.Helper()
	if os.Getenv(browsertest.EnvScreenshots) != "1" {
		return t.TempDir()
	}
	dir := filepath.Join("..", "..", "docs")
	st, err := os.Stat(dir)
	require.NoError(t, err, "%s=1 writes into the repository's docs folder", browsertest.EnvScreenshots)
	require.True(t, st.IsDir())
	return dir
}

// demo is the broker of a small "orders service" for the screenshots: four
// topics, seven subscribers, one stuck with a backlog, one failing whose
// circuit breaker opens (after two messages exhausted their retries),
// dead letters with three error codes, and traffic that flows every 100 ms
// until halt (or the end of the test).
type demo struct {
	s       *site
	release chan struct{} // unblocks the stuck subscriber
	stop    chan struct{} // ends the traffic
	waves   chan int      // each wave of traffic sent
	wg      sync.WaitGroup
	once    sync.Once
}

func newDemo(t *testing.T) *demo {
	t.Helper()
	s := newSite(t, admin.Options{Title: "orders service", AllowActions: true,
		SampleInterval: 100 * time.Millisecond, SampleInBackground: true},
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 2, Backoff: broker.ConstantBackoff(time.Millisecond)}))
	d := &demo{s: s, release: make(chan struct{}), stop: make(chan struct{}), waves: make(chan int, 256)}
	t.Cleanup(func() { // before the broker closes (cleanups run last first)
		d.halt()
		close(d.release)
	})

	ok := func(context.Context, broker.Message) error { return nil }
	everyNth := func(n int, err error) broker.Handler {
		var mu sync.Mutex
		seen := 0
		return func(context.Context, broker.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if seen++; seen%n == 0 {
				return err
			}
			return nil
		}
	}
	s.subscribe(t, "orders.created", "billing", ok, broker.Concurrency(4))
	s.subscribe(t, "orders.created", "inventory-reserve", ok, broker.Concurrency(2))
	s.subscribe(t, "orders.created", "fraud-check",
		everyNth(29, broker.Permanent(coded{"risk_rejected", "risk score 0.97 above threshold 0.90"})))
	s.subscribe(t, "payments.captured", "ledger", ok)
	receipts, err := s.b.Subscribe("payments.captured", "receipts-email",
		func(context.Context, broker.Message) error {
			return coded{"smtp_unavailable", "dial tcp 10.0.3.7:587: connect: connection refused"}
		},
		broker.CircuitBreaker(broker.BreakerPolicy{Failures: 7, OpenFor: time.Minute}),
		broker.RetryBudget(broker.DefaultRetryBudget()))
	require.NoError(t, err)
	t.Cleanup(func() { // its breaker stays open: cut its drain short
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_ = receipts.Unsubscribe(ctx)
	})
	s.subscribe(t, "inventory.adjusted", "search-indexer", func(ctx context.Context, _ broker.Message) error {
		select { // stuck on a slow dependency until the test ends
		case <-d.release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, broker.Concurrency(2), broker.LaneSize(256))
	s.subscribe(t, "notifications.push", "push-gateway",
		everyNth(12, broker.Permanent(coded{"device_token_invalid", "APNs: BadDeviceToken"})))

	d.wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for wave := 0; ; wave++ {
			for j := range 4 + wave%3 {
				n := wave*10 + j
				d.publish(t, broker.Message{ID: fmt.Sprintf("ord-%05d", 1000+n), Topic: "orders.created",
					Key:     fmt.Sprintf("customer-%d", 40+n%17),
					Headers: map[string]string{"traceparent": fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e%04d-00f067aa0ba902b7-01", n), "tenant": "eu-west"},
					Payload: fmt.Appendf(nil, `{"order_id":"ord-%05d","customer":"customer-%d","total":"%d.90","currency":"EUR"}`, 1000+n, 40+n%17, 20+n%80)})
			}
			for j := range 2 {
				n := wave*10 + j
				d.publish(t, broker.Message{ID: fmt.Sprintf("pay-%05d", 500+n), Topic: "payments.captured",
					Payload: fmt.Appendf(nil, `{"payment_id":"pay-%05d","amount":"%d.90"}`, 500+n, 20+n%80)})
			}
			if wave%2 == 0 {
				d.publish(t, broker.Message{ID: fmt.Sprintf("sku-%d", wave), Topic: "inventory.adjusted",
					Payload: fmt.Appendf(nil, `{"sku":"SKU-%04d","delta":-1}`, wave)})
			}
			d.publish(t, broker.Message{ID: fmt.Sprintf("push-%d", wave), Topic: "notifications.push",
				Payload: []byte(`{"title":"Your order has shipped"}`)})
			select {
			case d.waves <- wave:
			default:
			}
			select {
			case <-d.stop:
				return
			case <-tick.C:
			}
		}
	})
	return d
}

// publish publishes from the traffic goroutine (it may not call t.Fatal).
func (d *demo) publish(t *testing.T, m broker.Message) {
	if err := d.s.b.Publish(context.Background(), m); err != nil && !errors.Is(err, broker.ErrClosed) {
		t.Errorf("publish %s: %v", m.ID, err)
	}
}

// halt stops the traffic and waits for it.
func (d *demo) halt() {
	d.once.Do(func() { close(d.stop) })
	d.wg.Wait()
}

// TestScreenshots writes full-page PNG screenshots of the overview and of the
// dead-letter list of a busy broker: admin-overview.png,
// admin-deadletters.png and, at phone width (390 px),
// admin-deadletters-phone.png, into docs/ with BROKER_SCREENSHOTS=1.
func TestScreenshots(t *testing.T) {
	dir := screenshotDir(t)
	br := newBrowser(t)
	d := newDemo(t)
	s := d.s
	for w := 0; w < 25; { // 2.5 s of traffic: samples for the charts and rates
		select {
		case w = <-d.waves:
		case <-time.After(waitFor):
			t.Fatal("the traffic stalled")
		}
	}
	require.Eventually(t, func() bool {
		ss := s.b.Stats().Topics["payments.captured"].Subscribers["receipts-email"]
		return ss.Breaker == broker.BreakerOpen
	}, waitFor, 5*time.Millisecond, "the breaker should open")

	// The page's widest layout; the full-page screenshot is as tall as the
	// page.
	br.do(t, chromedp.EmulateViewport(1600, 480))
	minWidth := 1000
	shoot := func(page, file string) { // the page shown
		t.Helper()
		require.Equal(t, page, br.page(t))
		img, err := chromedp.Run(br.ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		cfg, err := png.DecodeConfig(bytes.NewReader(img))
		require.NoError(t, err, "a PNG")
		assert.GreaterOrEqual(t, cfg.Width, minWidth)
		assert.Greater(t, cfg.Height, 0)
		path := filepath.Join(dir, file)
		require.NoError(t, os.WriteFile(path, img, 0o644))
		t.Logf("%s: %dx%d, %d bytes", path, cfg.Width, cfg.Height, len(img))
	}

	// The overview shows what the screenshot is meant to show.
	br.open(t, s.admin)
	br.waitJS(t, `document.querySelectorAll('section.topic[data-topic]').length === 4`)
	assert.Equal(t, 1, eval[int](t, br, `document.querySelectorAll('td.breaker-open').length`), "a breaker open")
	assert.Equal(t, 7, eval[int](t, br, `document.querySelectorAll('tr[data-subscriber]').length`))
	br.waitJS(t, `Number(document.querySelector('#summary [data-field="dead_letters"]').textContent) >= 4`)
	shoot("overview", "admin-overview.png")

	d.halt()
	br.open(t, s.admin+"deadletters")
	require.GreaterOrEqual(t, len(br.rowIDs(t)), 4)
	shoot("deadletters", "admin-deadletters.png")
	br.do(t, chromedp.EmulateViewport(390, 844))
	minWidth = 390
	br.open(t, s.admin+"deadletters")
	shoot("deadletters", "admin-deadletters-phone.png")
	codes := eval[[]string](t, br, `Array.from(new Set(Array.from(document.querySelectorAll('#dead-letters tbody tr[data-dead-letter] .code'), c => c.textContent))).sort()`)
	assert.Equal(t, []string{"device_token_invalid", "risk_rejected", "smtp_unavailable"}, codes, "dead letters with different codes")
}
