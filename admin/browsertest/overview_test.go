package browsertest_test

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
)

// overviewDOM is what the overview shows, read from its data-field hooks.
type overviewDOM struct {
	Page    string            `json:"page"`
	Summary map[string]string `json:"summary"`
	Topics  []struct {
		Name string            `json:"name"`
		Head map[string]string `json:"head"`
		Subs []struct {
			Name    string            `json:"name"`
			Active  string            `json:"active"`
			Breaker string            `json:"breaker"` // the cell's class
			Fields  map[string]string `json:"fields"`
		} `json:"subs"`
	} `json:"topics"`
	Retired []string `json:"retired"`
}

// readOverview is the script that reads an overviewDOM.
const readOverview = `(() => {
  const fields = (els) => Object.fromEntries(Array.from(els, e => [e.dataset.field, e.textContent.trim()]));
  return {
    page: document.body.dataset.page,
    summary: fields(document.querySelectorAll('#summary [data-field]')),
    topics: Array.from(document.querySelectorAll('section.topic[data-topic]'), s => ({
      name: s.dataset.topic,
      head: fields(s.querySelectorAll('.topic-head [data-field]')),
      subs: Array.from(s.querySelectorAll('tr[data-subscriber]'), r => ({
        name: r.dataset.subscriber,
        active: r.dataset.active,
        breaker: r.querySelector('[data-field="breaker"]').className,
        fields: fields(r.querySelectorAll('[data-field]')),
      })),
    })),
    retired: Array.from(document.querySelectorAll('#retired tr[data-retired-topic]'), r => r.dataset.retiredTopic),
  };
})()`

// TestOverviewListsLiveTopics publishes to two topics with subscribers (and
// one without), and checks that the overview has a section per live topic,
// a row per subscriber, and the numbers of Stats in them; then that the
// page's script refreshes the numbers in place and reloads for a new topic.
func TestOverviewListsLiveTopics(t *testing.T) {
	s := newSite(t, admin.Options{SampleInterval: 200 * time.Millisecond})
	billing, audit := newSink(nil), newSink(nil)
	ledger := newSink(func(m broker.Message) error {
		if m.ID == "p-3" {
			return broker.Permanent(coded{"card_declined", "card declined"})
		}
		return nil
	})
	s.subscribe(t, "orders", "billing", billing.handle)
	s.subscribe(t, "orders", "audit", audit.handle, broker.Concurrency(3), broker.LaneSize(16))
	s.subscribe(t, "payments", "ledger", ledger.handle)
	for i := 1; i <= 3; i++ {
		s.publish(t, broker.Message{ID: fmt.Sprintf("o-%d", i), Topic: "orders"})
	}
	s.publish(t, broker.Message{ID: "o-1", Topic: "orders"}) // a duplicate
	for i := 1; i <= 5; i++ {
		s.publish(t, broker.Message{ID: fmt.Sprintf("p-%d", i), Topic: "payments"})
	}
	s.publish(t, broker.Message{ID: "n-1", Topic: "nobody"}) // unrouted: the topic retires
	s.waitQuiet(t)
	require.Eventually(t, func() bool { // "nobody" retires once its dispatcher saw it
		return !live(s.b.Stats().Topics["nobody"])
	}, waitFor, 5*time.Millisecond)
	st := s.b.Stats()

	// The fixture is what it should be, so that the page is compared with
	// known numbers.
	require.Equal(t, uint64(4), st.Topics["orders"].Published)
	require.Equal(t, uint64(1), st.Topics["orders"].Subscribers["billing"].Deduplicated)
	require.Equal(t, uint64(1), st.Topics["payments"].Subscribers["ledger"].DeadLettered)
	require.Equal(t, 3, st.Topics["orders"].Subscribers["audit"].Concurrency)

	br := newBrowser(t)
	br.open(t, s.admin)
	got := eval[overviewDOM](t, br, readOverview)

	assert.Equal(t, "overview", got.Page)
	var names []string
	for _, tp := range got.Topics {
		names = append(names, tp.Name)
	}
	require.Equal(t, []string{"orders", "payments"}, names, "live topics, sorted")
	assert.Equal(t, []string{"nobody"}, got.Retired, "retired topics")

	assert.Equal(t, "2", got.Summary["live_topics"])
	assert.Equal(t, "0", got.Summary["backlog"])
	assert.Equal(t, "1", got.Summary["dead_letters"])

	for _, tp := range got.Topics {
		ts := st.Topics[tp.Name]
		want := map[string]string{
			"backlog":   itoa(ts.Backlog()),
			"queued":    itoa(ts.Queued),
			"capacity":  itoa(ts.Capacity),
			"published": utoa(ts.Published),
			"rejected":  utoa(ts.Rejected),
			"unrouted":  utoa(ts.Unrouted),
		}
		for k, v := range want {
			assert.Equal(t, v, tp.Head[k], "topic %s: %s", tp.Name, k)
		}
		var subs []string
		for _, sub := range tp.Subs {
			subs = append(subs, sub.Name)
			ss := ts.Subscribers[sub.Name]
			assert.Equal(t, "true", sub.Active, "%s/%s active", tp.Name, sub.Name)
			assert.Equal(t, "breaker breaker-none", sub.Breaker, "%s/%s breaker", tp.Name, sub.Name)
			want := map[string]string{
				"backlog":           itoa(ss.Backlog()),
				"dead_lettered":     utoa(ss.DeadLettered),
				"retries":           utoa(ss.Retries),
				"in_flight":         itoa(ss.InFlight),
				"queued":            itoa(ss.Queued),
				"capacity":          itoa(ss.Capacity),
				"parked":            itoa(ss.Parked),
				"held":              itoa(ss.Held),
				"concurrency":       itoa(ss.Concurrency),
				"delivered":         utoa(ss.Delivered),
				"deduplicated":      utoa(ss.Deduplicated),
				"retry_budget_left": "–", // no budget
			}
			for k, v := range want {
				assert.Equal(t, v, sub.Fields[k], "%s/%s: %s", tp.Name, sub.Name, k)
			}
		}
		want2 := make([]string, 0, len(ts.Subscribers))
		for name := range ts.Subscribers {
			want2 = append(want2, name)
		}
		slices.Sort(want2)
		assert.Equal(t, want2, subs, "topic %s: subscribers, sorted", tp.Name)
	}
	// The ones the fixture made distinct, by value.
	assert.Equal(t, "5", field(got, "payments", "", "published"))
	assert.Equal(t, "4", field(got, "payments", "ledger", "delivered"))
	assert.Equal(t, "1", field(got, "payments", "ledger", "dead_lettered"))
	assert.Equal(t, "3", field(got, "orders", "audit", "concurrency"))
	assert.Equal(t, "16", field(got, "orders", "audit", "capacity"))
	assert.Equal(t, "1", field(got, "orders", "billing", "deduplicated"))

	// The script refreshes the numbers in place (no reload: the mark stays).
	eval[chromedp.Void](t, br, `window.__mark = "same page"`)
	s.publish(t, broker.Message{ID: "p-6", Topic: "payments"}, broker.Message{ID: "p-7", Topic: "payments"})
	s.waitQuiet(t)
	br.waitJS(t, `document.querySelector('section.topic[data-topic="payments"] .topic-head [data-field="published"]').textContent === "7"`)
	br.waitJS(t, `document.querySelector('tr[data-subscriber="ledger"] [data-field="delivered"]').textContent === "6"`)
	assert.Equal(t, "same page", eval[string](t, br, `window.__mark`))

	// A new live topic makes it reload, and the topic appears.
	shipping := newSink(nil)
	s.subscribe(t, "shipping", "courier", shipping.handle)
	br.do(t, chromedp.WaitReady(chromedp.CSS(`section.topic[data-topic="shipping"] tr[data-subscriber="courier"]`)))
	assert.Equal(t, "undefined", eval[string](t, br, `typeof window.__mark`), "the page reloaded")
	assert.Equal(t, "3", eval[string](t, br, `document.querySelector('#summary [data-field="live_topics"]').textContent`))
}

// live reports whether a topic is live as the admin page decides: it has a
// queue (retired topics report a capacity of 0), an active subscriber or
// something waiting.
func live(ts broker.TopicStats) bool {
	if ts.Capacity > 0 || ts.Queued > 0 {
		return true
	}
	for _, ss := range ts.Subscribers {
		if ss.Active || ss.Backlog() > 0 {
			return true
		}
	}
	return false
}

// field returns a data-field of a topic's head (sub "") or of one of its
// subscribers' rows.
func field(o overviewDOM, topic, sub, name string) string {
	for _, tp := range o.Topics {
		if tp.Name != topic {
			continue
		}
		if sub == "" {
			return tp.Head[name]
		}
		for _, s := range tp.Subs {
			if s.Name == sub {
				return s.Fields[name]
			}
		}
	}
	return "(missing)"
}

func itoa(n int) string    { return strconv.Itoa(n) }
func utoa(n uint64) string { return strconv.FormatUint(n, 10) }
