package browsertest_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
)

// failOnce is a subscriber that dead-letters the first delivery of every
// message (Permanent) and takes every later one: a redrive.
func failOnce() *sink {
	return newSink(func(broker.Message) error {
		return broker.Permanent(coded{"invalid_order", "order has no lines"})
	})
}

// waitTaken waits until the sink has taken n messages and returns their IDs.
func waitTaken(t *testing.T, k *sink, n int) []string {
	t.Helper()
	require.Eventually(t, func() bool { return len(k.taken()) >= n }, waitFor, 5*time.Millisecond,
		"the subscriber should have taken %d messages", n)
	return k.taken()
}

// actionsSite returns a site with actions on, a failOnce subscriber on
// "orders" and n dead letters of it (messages order-1…order-n), oldest
// first.
func actionsSite(t *testing.T, n int) (*site, *sink, []broker.DeadLetter) {
	t.Helper()
	s := newSite(t, admin.Options{AllowActions: true})
	k := failOnce()
	s.subscribe(t, "orders", "billing", k.handle)
	for i := 1; i <= n; i++ {
		s.publish(t, broker.Message{ID: fmt.Sprintf("order-%d", i), Topic: "orders"})
	}
	return s, k, s.waitDeadLetters(t, n)
}

// TestRedriveDeliversAndRemoves ticks one dead letter in the list and
// clicks Redrive, then redrives another from its detail page: each time
// the subscriber gets the message, the dead letter leaves the store and
// its row the page, and the others stay.
func TestRedriveDeliversAndRemoves(t *testing.T) {
	s, k, dls := actionsSite(t, 3)
	br := newBrowser(t)
	br.open(t, s.admin+"deadletters")
	require.Equal(t, "on", eval[string](t, br, `document.body.dataset.actions`))
	require.Equal(t, []string{dls[2].ID, dls[1].ID, dls[0].ID}, br.rowIDs(t), "newest first")

	// From the list: tick the first row, click Redrive. Dismissing its
	// confirmation sends nothing.
	row := `#dead-letters tr[data-dead-letter=` + attr(dls[0].ID) + `]`
	br.do(t, chromedp.Click(chromedp.CSS(row+` input[type=checkbox][name=id]`)))
	eval[chromedp.Void](t, br, `window.__mark = "same page"`)
	br.accept.Store(false)
	br.do(t, chromedp.Click(chromedp.CSS(`#actions-form button[data-action="redrive"]`)))
	require.Equal(t, 1, br.dialogCount(), "redrive asks first")
	assert.Contains(t, <-br.opened, "Redrive the selected")
	assert.Equal(t, "same page", eval[string](t, br, `window.__mark`), "no navigation")
	assert.Empty(t, s.posts(prefix+"redrive"), "dismissed: nothing sent")
	br.accept.Store(true)
	require.Equal(t, 200, br.follow(t, chromedp.Click(chromedp.CSS(`#actions-form button[data-action="redrive"]`))), "%+v", s.posts(prefix+"redrive"))
	assert.Equal(t, "deadletters", br.page(t))
	assert.Equal(t, "redrive", eval[string](t, br, `document.getElementById('notice').dataset.done`))
	assert.False(t, eval[bool](t, br, `document.getElementById('notice').classList.contains('notice-bad')`))
	assert.Equal(t, []string{"order-1"}, waitTaken(t, k, 1), "the subscriber got the redriven message")
	assert.False(t, s.has(t, dls[0].ID), "the redriven dead letter left the store")
	assert.Equal(t, []string{dls[2].ID, dls[1].ID}, br.rowIDs(t), "its row left the page")

	// From the detail page: follow the row's link, click Redrive there.
	row = `#dead-letters tr[data-dead-letter=` + attr(dls[1].ID) + `]`
	require.Equal(t, 200, br.follow(t, chromedp.Click(chromedp.CSS(row+` a.detail-link`))))
	require.Equal(t, "deadletter", br.page(t))
	require.Equal(t, dls[1].ID, eval[string](t, br, `document.getElementById('dl-id').textContent`))
	require.Equal(t, 200, br.follow(t, chromedp.Click(chromedp.CSS(`#actions-form button[data-action="redrive"]`))))
	assert.Equal(t, "deadletters", br.page(t))
	assert.Equal(t, "redrive", eval[string](t, br, `document.getElementById('notice').dataset.done`))
	assert.Equal(t, []string{"order-1", "order-2"}, waitTaken(t, k, 2))
	assert.False(t, s.has(t, dls[1].ID))
	assert.Equal(t, []string{dls[2].ID}, br.rowIDs(t))

	n, err := s.b.DeadLetters().Len(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, n, "one dead letter left")
	assert.True(t, s.has(t, dls[2].ID), "the untouched one stays")
	assert.Len(t, s.posts(prefix+"redrive"), 2, "one POST per click")
	assert.Equal(t, 3, br.dialogCount(), "each redrive asked first")
}

// TestDeleteAsksFirst ticks every row with the script's select-all box and
// clicks Delete: dismissing the confirm() dialog sends nothing and deletes
// nothing; accepting it deletes them all, and none is delivered.
func TestDeleteAsksFirst(t *testing.T) {
	s, k, dls := actionsSite(t, 3)
	br := newBrowser(t)
	br.open(t, s.admin+"deadletters")

	// The script shows the select-all box (and hides the link); it ticks
	// every row.
	require.True(t, eval[bool](t, br, `!document.getElementById('select-all').hidden && document.getElementById('select-all-link').hidden`))
	br.do(t, chromedp.Click(chromedp.CSS(`#select-all`)))
	require.Equal(t, 3, eval[int](t, br, `document.querySelectorAll('#dead-letters input[name=id]:checked').length`))
	confirmText := eval[string](t, br, `document.querySelector('#actions-form button[data-action="delete"]').dataset.confirm`)
	require.NotEmpty(t, confirmText)

	// Dismissed: the click returns once the dialog is answered, and the
	// form is not sent.
	eval[chromedp.Void](t, br, `window.__mark = "same page"`)
	br.accept.Store(false)
	br.do(t, chromedp.Click(chromedp.CSS(`#actions-form button[data-action="delete"]`)))
	require.Equal(t, 1, br.dialogCount())
	assert.Equal(t, confirmText, <-br.opened, "the dialog asks the button's question")
	assert.Equal(t, "same page", eval[string](t, br, `window.__mark`), "no navigation")
	assert.Len(t, s.deadLetters(t, broker.DeadLetterFilter{}), 3, "nothing deleted")
	// (Had the form gone, the POST count below would show it, even if it
	// reached the server only after these checks.)

	// Accepted: deleted.
	br.accept.Store(true)
	require.Equal(t, 200, br.follow(t, chromedp.Click(chromedp.CSS(`#actions-form button[data-action="delete"]`))))
	require.Equal(t, 2, br.dialogCount())
	assert.Equal(t, "deadletters", br.page(t))
	assert.Equal(t, "delete", eval[string](t, br, `document.getElementById('notice').dataset.done`))
	assert.False(t, eval[bool](t, br, `document.getElementById('notice').classList.contains('notice-bad')`))
	assert.Empty(t, br.rowIDs(t))
	assert.True(t, eval[bool](t, br, `!!document.querySelector('#dead-letters tbody tr.empty')`))
	for _, d := range dls {
		assert.False(t, s.has(t, d.ID), "%s deleted", d.ID)
	}
	assert.Len(t, s.posts(prefix+"delete"), 1, "only the accepted click sent the form")
	assert.Empty(t, k.taken(), "a deleted dead letter is not delivered")
}
