package browsertest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
)

// deadLetterFixture subscribes three failing subscribers on two topics and
// dead-letters two messages at each:
//
//	orders/billing   code invalid_order  reason permanent (Permanent ErrorCoder)
//	orders/audit     code error          reason exhausted (retried once)
//	payments/ledger  code card_declined  reason permanent (Permanent ErrorCoder)
//
// It returns the six dead letters, oldest first.
func deadLetterFixture(t *testing.T, s *site) []broker.DeadLetter {
	t.Helper()
	billing := newSink(func(broker.Message) error {
		return broker.Permanent(coded{"invalid_order", "order has no lines"})
	})
	ledger := newSink(func(broker.Message) error {
		return broker.Permanent(coded{"card_declined", "card declined by issuer"})
	})
	s.subscribe(t, "orders", "billing", billing.handle)
	s.subscribe(t, "orders", "audit", func(context.Context, broker.Message) error {
		return errors.New("audit store unavailable") // every attempt: exhausted after the retry
	})
	s.subscribe(t, "payments", "ledger", ledger.handle)
	for i := 1; i <= 2; i++ {
		s.publish(t, broker.Message{ID: fmt.Sprintf("order-%d", i), Topic: "orders"},
			broker.Message{ID: fmt.Sprintf("payment-%d", i), Topic: "payments"})
	}
	return s.waitDeadLetters(t, 6)
}

// TestFilterNarrowsDeadLetters fills the filter form of the dead-letter
// list, submits it, and checks that exactly the matching dead letters are
// listed, for each field of the filter and for no match at all.
func TestFilterNarrowsDeadLetters(t *testing.T) {
	s := newSite(t, admin.Options{})
	all := deadLetterFixture(t, s)
	br := newBrowser(t)

	tests := []struct {
		name   string
		fields map[string]string // input name → value typed
		reason string            // option picked in the reason select ("" any)
		match  func(broker.DeadLetter) bool
	}{
		{"topic", map[string]string{"topic": "orders"}, "",
			func(d broker.DeadLetter) bool { return d.Message.Topic == "orders" }},
		{"topic and subscriber", map[string]string{"topic": "orders", "subscriber": "audit"}, "",
			func(d broker.DeadLetter) bool { return d.Message.Topic == "orders" && d.Subscriber == "audit" }},
		{"code", map[string]string{"code": "card_declined"}, "",
			func(d broker.DeadLetter) bool { return d.ErrorCode == "card_declined" }},
		{"reason", nil, broker.ReasonExhausted,
			func(d broker.DeadLetter) bool { return d.Reason == broker.ReasonExhausted }},
		{"topic and reason", map[string]string{"topic": "orders"}, broker.ReasonPermanent,
			func(d broker.DeadLetter) bool {
				return d.Message.Topic == "orders" && d.Reason == broker.ReasonPermanent
			}},
		{"nothing matches", map[string]string{"topic": "payments", "code": "invalid_order"}, "",
			func(broker.DeadLetter) bool { return false }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := []string{}
			for _, d := range slices.Backward(all) { // the list is newest first
				if tt.match(d) {
					want = append(want, d.ID)
				}
			}
			br.open(t, s.admin+"deadletters")
			require.Len(t, br.rowIDs(t), len(all), "unfiltered, the list has every dead letter")
			for name, v := range tt.fields {
				br.do(t, chromedp.SendKeys(chromedp.CSS(`#filter-form input[name=`+name+`]`), v))
			}
			if tt.reason != "" {
				br.do(t, chromedp.SetValue(chromedp.CSS(`#filter-form select[name=reason]`), tt.reason))
			}
			require.Equal(t, 200, br.follow(t, chromedp.Click(chromedp.CSS(`#filter-apply`))))

			require.Equal(t, "deadletters", br.page(t))
			got := br.rowIDs(t)
			assert.Equal(t, want, got, "rows shown, newest first")
			assert.Equal(t, fmt.Sprint(len(want)), eval[string](t, br, `document.getElementById('list-count').dataset.shown`))
			assert.Equal(t, fmt.Sprint(len(all)), eval[string](t, br, `document.getElementById('list-count').dataset.stored`))
			assert.Equal(t, len(want) == 0, eval[bool](t, br, `!!document.querySelector('#dead-letters tbody tr.empty')`), "the empty row")
			// Every row shown agrees with the filter in its own attributes,
			// and the form keeps what was asked.
			for name, v := range tt.fields {
				assert.Equal(t, v, eval[string](t, br, `document.querySelector('#filter-form input[name=`+name+`]').value`), "form keeps %s", name)
			}
			assert.Equal(t, tt.reason, eval[string](t, br, `document.querySelector('#filter-form select[name=reason]').value`))
			if topic, ok := tt.fields["topic"]; ok && len(want) > 0 {
				topics := eval[[]string](t, br, `Array.from(document.querySelectorAll('#dead-letters tbody tr[data-dead-letter]'), r => r.dataset.topic)`)
				assert.Equal(t, slices.Repeat([]string{topic}, len(want)), topics)
			}
		})
	}
}
