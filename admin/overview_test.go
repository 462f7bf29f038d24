package admin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
)

func TestNewRefusesBadOptions(t *testing.T) {
	b := newBroker(t)
	tests := []struct {
		name string
		b    *broker.Broker
		o    Options
	}{
		{"nil broker", nil, Options{}},
		{"negative SampleInterval", b, Options{SampleInterval: -time.Second}},
		{"SampleInterval too short", b, Options{SampleInterval: time.Millisecond}},
		{"negative History", b, Options{History: -1}},
		{"History too long", b, Options{History: MaxHistory + 1}},
		{"negative PageSize", b, Options{PageSize: -1}},
		{"PageSize too large", b, Options{PageSize: MaxPageSize + 1}},
		{"negative MaxScan", b, Options{MaxScan: -1}},
		{"negative PayloadLimit", b, Options{PayloadLimit: -1}},
		{"malformed trusted origin", b, Options{TrustedOrigins: []string{"://nope"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := New(tt.b, tt.o)
			require.ErrorIs(t, err, ErrInvalidOption)
			require.Nil(t, h)
			require.True(t, strings.HasPrefix(err.Error(), "admin: "), err.Error())
		})
	}
}

// TestOverviewMatchesStats: every live topic and subscriber is on the page
// and in api/stats, with the numbers of Stats.
func TestOverviewMatchesStats(t *testing.T) {
	b := newBroker(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the broker's Close (cleanups run last first)
	h := newHandler(t, b, Options{})

	_, err := b.Subscribe("orders", "billing", ok)
	require.NoError(t, err)
	_, err = b.Subscribe("orders", "mailer", bad)
	require.NoError(t, err)
	_, err = b.Subscribe("slow", "worker", func(ctx context.Context, m broker.Message) error {
		<-release
		return nil
	}, broker.LaneSize(8))
	require.NoError(t, err)
	for i := range 3 {
		publish(t, b, broker.Message{ID: fmt.Sprint("o", i), Topic: "orders"})
		publish(t, b, broker.Message{ID: fmt.Sprint("s", i), Topic: "slow"})
	}
	waitDeadLetters(t, b, 3)
	waitFor(t, "orders delivered and slow stuck", func() bool {
		st := b.Stats()
		w := st.Topics["slow"].Subscribers["worker"]
		return st.Topics["orders"].Backlog() == 0 && w.InFlight == 1 && w.Queued == 2
	})

	var snap Snapshot
	getJSON(t, h, "/api/stats", &snap)
	page := getOK(t, h, "/")
	st := b.Stats() // quiet: the same counters as the handler read

	require.Len(t, snap.Topics, len(st.Topics))
	assert.Equal(t, 2, snap.LiveTopics)
	assert.Equal(t, 3, snap.DeadLetters)
	assert.Equal(t, 3, snap.Backlog)
	for _, ts := range snap.Topics {
		want := st.Topics[ts.Name]
		assert.True(t, ts.Live, ts.Name)
		assert.Equal(t, want.Published, ts.Published, ts.Name)
		assert.Equal(t, want.Queued, ts.Queued, ts.Name)
		assert.Equal(t, want.Capacity, ts.Capacity, ts.Name)
		assert.Equal(t, want.Backlog(), ts.Backlog, ts.Name)
		require.Len(t, ts.Subscribers, len(want.Subscribers), ts.Name)

		sec := section(page, ts.Name)
		require.NotEmpty(t, sec, "no section for topic %s", ts.Name)
		head := fields(between(sec, `<div class="topic-head">`, "</dl>"))
		assert.Equal(t, strconv.FormatUint(want.Published, 10), head["published"], ts.Name)
		assert.Equal(t, strconv.Itoa(want.Backlog()), head["backlog"], ts.Name)
		assert.Equal(t, strconv.Itoa(want.Capacity), head["capacity"], ts.Name)

		for _, ss := range ts.Subscribers {
			w := want.Subscribers[ss.Name]
			name := ts.Name + "/" + ss.Name
			assert.Equal(t, w.Delivered, ss.Delivered, name)
			assert.Equal(t, w.DeadLettered, ss.DeadLettered, name)
			assert.Equal(t, w.Retries, ss.Retries, name)
			assert.Equal(t, w.InFlight, ss.InFlight, name)
			assert.Equal(t, w.Queued, ss.Queued, name)
			assert.Equal(t, w.Capacity, ss.Capacity, name)
			assert.Equal(t, w.Backlog(), ss.Backlog, name)
			assert.Equal(t, string(w.Breaker), ss.Breaker, name)

			r := row(sec, ss.Name)
			require.NotEmpty(t, r, "no row for %s", name)
			got := fields(r)
			for field, v := range map[string]int{
				"backlog":       w.Backlog(),
				"in_flight":     w.InFlight,
				"queued":        w.Queued,
				"capacity":      w.Capacity,
				"parked":        w.Parked,
				"held":          w.Held,
				"concurrency":   w.Concurrency,
				"delivered":     int(w.Delivered),
				"retries":       int(w.Retries),
				"dead_lettered": int(w.DeadLettered),
				"deduplicated":  int(w.Deduplicated),
			} {
				assert.Equal(t, strconv.Itoa(v), got[field], "%s %s", name, field)
			}
		}
	}
	// The numbers that tell the story, spelled out.
	slow := fields(row(section(page, "slow"), "worker"))
	assert.Equal(t, "1", slow["in_flight"])
	assert.Equal(t, "2", slow["queued"])
	assert.Equal(t, "8", slow["capacity"])
	assert.NotEqual(t, "0", slow["oldest_age_seconds"], "a waiting message has an age")
	assert.Equal(t, "3", fields(row(section(page, "orders"), "mailer"))["dead_lettered"])
	assert.Contains(t, row(section(page, "orders"), "mailer"), `class="warn"`, "dead letters stand out")
}

// TestTopicsNoLongerLiveAreDropped: a retired topic leaves the live list and
// its chart samples are dropped; a topic Stats forgot leaves the page.
func TestTopicsNoLongerLiveAreDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		h := newHandler(t, b, Options{SampleInterval: time.Second})
		sub, err := b.Subscribe("temp", "s", ok)
		require.NoError(t, err)
		_, err = b.Subscribe("keep", "s", ok)
		require.NoError(t, err)
		publish(t, b, broker.Message{ID: "1", Topic: "temp"})
		synctest.Wait()

		var snap Snapshot
		getJSON(t, h, "/api/stats", &snap)
		time.Sleep(time.Second)
		getJSON(t, h, "/api/stats", &snap)
		require.Len(t, topicOf(t, snap, "temp").Chart.Samples, 2)
		require.Contains(t, getOK(t, h, "/"), `data-topic="temp"`)

		require.NoError(t, sub.Unsubscribe(context.Background()))
		synctest.Wait()
		require.False(t, live(b.Stats().Topics["temp"]), "temp should have retired")

		time.Sleep(time.Second)
		getJSON(t, h, "/api/stats", &snap)
		temp := topicOf(t, snap, "temp")
		assert.False(t, temp.Live)
		assert.Empty(t, temp.Chart.Samples)
		assert.Len(t, topicOf(t, snap, "keep").Chart.Samples, 3)
		h.samp.mu.Lock()
		_, kept := h.samp.topics["temp"]
		h.samp.mu.Unlock()
		assert.False(t, kept, "the retired topic's samples are dropped")
		page := getOK(t, h, "/")
		assert.NotContains(t, page, `<section class="topic" data-topic="temp"`)
		assert.Contains(t, page, `data-retired-topic="temp"`)

		// Retire MaxGoneTopics more: Stats forget temp, and so does the page.
		for i := range broker.MaxGoneTopics {
			publish(t, b, broker.Message{ID: "x", Topic: fmt.Sprintf("gone-%04d", i)})
		}
		synctest.Wait()
		_, inStats := b.Stats().Topics["temp"]
		require.False(t, inStats)
		time.Sleep(time.Second)
		getJSON(t, h, "/api/stats", &snap)
		for _, ts := range snap.Topics {
			assert.NotEqual(t, "temp", ts.Name)
		}
		page = getOK(t, h, "/")
		assert.NotContains(t, page, `"temp"`)
		assert.Contains(t, page, "and 924 more") // 1024 retired topics kept, 100 listed
		h.samp.mu.Lock()
		assert.Len(t, h.samp.topics, 1, "only the live topic keeps samples")
		h.samp.mu.Unlock()
	})
}

func topicOf(t *testing.T, snap Snapshot, name string) TopicSnapshot {
	t.Helper()
	for _, ts := range snap.Topics {
		if ts.Name == name {
			return ts
		}
	}
	t.Fatalf("topic %q not in the snapshot", name)
	return TopicSnapshot{}
}

func subOf(t *testing.T, ts TopicSnapshot, name string) SubscriberSnapshot {
	t.Helper()
	for _, s := range ts.Subscribers {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("subscriber %q not in topic %q", name, ts.Name)
	return SubscriberSnapshot{}
}

// TestRates: rates are the difference of two samples over the time between
// them, unknown before the second sample and after a long gap.
func TestRates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		h := newHandler(t, b, Options{SampleInterval: time.Second})
		_, err := b.Subscribe("t", "s", ok)
		require.NoError(t, err)
		n := 0
		burst := func(k int) {
			for range k {
				n++
				publish(t, b, broker.Message{ID: strconv.Itoa(n), Topic: "t"})
			}
			synctest.Wait()
		}
		rates := func() (pub, del *float64) {
			var snap Snapshot
			getJSON(t, h, "/api/stats", &snap)
			ts := topicOf(t, snap, "t")
			return ts.PublishRate, subOf(t, ts, "s").DeliveredRate
		}
		f := func(x float64) *float64 { return &x }

		pub, del := rates()
		assert.Nil(t, pub, "one sample gives no rate")
		assert.Nil(t, del)

		burst(10)
		time.Sleep(2 * time.Second)
		pub, del = rates()
		assert.Equal(t, f(5), pub, "10 messages in 2 s")
		assert.Equal(t, f(5), del)

		burst(4)
		time.Sleep(500 * time.Millisecond)
		pub, del = rates()
		assert.Equal(t, f(5), pub, "no new sample within the interval")
		assert.Equal(t, f(5), del)

		time.Sleep(1500 * time.Millisecond)
		pub, del = rates()
		assert.Equal(t, f(2), pub, "4 messages in 2 s")
		assert.Equal(t, f(2), del)

		time.Sleep(6 * time.Second)
		pub, del = rates()
		assert.Nil(t, pub, "a gap of more than 5 intervals says nothing about now")
		assert.Nil(t, del)

		time.Sleep(time.Second)
		pub, del = rates()
		assert.Equal(t, f(0), pub)
		assert.Equal(t, f(0), del)
		assert.Contains(t, fields(row(section(getOK(t, h, "/"), "t"), "s"))["delivered_rate"], "0.0/s")
	})
}

// TestChartKeepsHistorySamples: the ring keeps the last History samples,
// drawn with the newest at the right edge and the peak at the top.
func TestChartKeepsHistorySamples(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		h := newHandler(t, b, Options{SampleInterval: time.Second, History: 3})
		_, err := b.Subscribe("t", "stuck", func(ctx context.Context, m broker.Message) error {
			<-release
			return nil
		})
		require.NoError(t, err)
		var snap Snapshot
		for i := range 5 { // backlog 1, 2, 3, 4, 5, a sample a second
			if i > 0 {
				time.Sleep(time.Second)
			}
			publish(t, b, broker.Message{ID: strconv.Itoa(i), Topic: "t"})
			synctest.Wait()
			getJSON(t, h, "/api/stats", &snap)
		}
		c := topicOf(t, snap, "t").Chart
		var got []int
		for _, s := range c.Samples {
			got = append(got, s.Backlog)
		}
		assert.Equal(t, []int{3, 4, 5}, got)
		assert.Equal(t, 5, c.Max)
		assert.Equal(t, "0.0,16.2 120.0,8.6 240.0,1.0", c.Points)
		page := getOK(t, h, "/") // within the interval: no new sample
		assert.Contains(t, section(page, "t"), `points="0.0,16.2 120.0,8.6 240.0,1.0"`)
	})
}

func TestChartGeometry(t *testing.T) {
	at := time.Unix(0, 0)
	tests := []struct {
		name    string
		backlog []int
		size    int
		want    string
	}{
		{"empty", nil, 10, ""},
		{"one sample at the right edge", []int{0}, 10, "240.0,39.0"},
		{"all zero along the bottom", []int{0, 0}, 3, "120.0,39.0 240.0,39.0"},
		{"peak at the top", []int{2, 1}, 2, "0.0,1.0 240.0,20.0"},
		{"size one", []int{7}, 1, "240.0,1.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s []Sample
			for _, v := range tt.backlog {
				s = append(s, Sample{At: at, Backlog: v})
			}
			assert.Equal(t, tt.want, chart(s, tt.size).Points)
		})
	}
}

// TestBackgroundSampler: with SampleInBackground the charts fill while
// nobody looks; Close ends the goroutine (synctest.Test would report it
// blocked forever otherwise, and goleak checks the package).
func TestBackgroundSampler(t *testing.T) {
	samples := func(h *Handler, topic string) int {
		h.samp.mu.Lock()
		defer h.samp.mu.Unlock()
		if th := h.samp.topics[topic]; th != nil {
			return len(th.ring)
		}
		return 0
	}
	synctest.Test(t, func(t *testing.T) {
		b := newBroker(t)
		_, err := b.Subscribe("t", "s", ok)
		require.NoError(t, err)

		idle, err := New(b, Options{SampleInterval: time.Second, Logger: discard})
		require.NoError(t, err)
		bg, err := New(b, Options{SampleInterval: time.Second, SampleInBackground: true, Logger: discard})
		require.NoError(t, err)
		time.Sleep(5500 * time.Millisecond)
		assert.Equal(t, 0, samples(idle, "t"), "without SampleInBackground nothing samples between requests")
		assert.Equal(t, 6, samples(bg, "t"), "at 0, 1, 2, 3, 4 and 5 s")

		require.NoError(t, bg.Close())
		require.NoError(t, bg.Close(), "a second Close is harmless")
		require.NoError(t, idle.Close())
		time.Sleep(3 * time.Second)
		assert.Equal(t, 6, samples(bg, "t"), "Close stopped the sampler")
		// The handler still serves, sampling on requests.
		getOK(t, bg, "/api/stats")
		assert.Equal(t, 7, samples(bg, "t"))
	})
}

// TestConcurrentRequests runs pages, the API and sampling against a busy
// broker, for the race detector.
func TestConcurrentRequests(t *testing.T) {
	b := newBroker(t)
	h := newHandler(t, b, Options{SampleInterval: MinSampleInterval, SampleInBackground: true, AllowActions: true})
	_, err := b.Subscribe("t", "ok", ok)
	require.NoError(t, err)
	_, err = b.Subscribe("t", "bad", bad)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 300 {
			if err := b.Publish(context.Background(), broker.Message{ID: strconv.Itoa(i), Topic: "t"}); err != nil && !errors.Is(err, broker.ErrQueueFull) {
				t.Error(err)
			}
		}
	})
	for range 4 {
		wg.Go(func() {
			for _, p := range []string{"/", "/api/stats", "/deadletters", "/api/deadletters?reason=permanent", "/", "/api/stats"} {
				if w := get(h, p); w.Code != 200 {
					t.Errorf("GET %s: %d", p, w.Code)
				}
			}
		})
	}
	wg.Wait()
}
