package browsertest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
)

// hostileSite has dead letters with hostile fields: 10 KB message IDs,
// 256 KiB errors, a 64 KiB header (name and value), and a topic and
// subscriber with a bidirectional override ("bidi-" U+202E "evil").
func hostileSite(t *testing.T) (*site, string) {
	t.Helper()
	s := newSite(t, admin.Options{AllowActions: true})
	evil := "bidi-\u202eevil"
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range 20 {
		dl := broker.DeadLetter{ID: fmt.Sprint("dl-", i), Subscriber: "billing", ErrorCode: broker.CodeError,
			Reason: broker.ReasonExhausted, Error: strings.Repeat("e", 256<<10), FailedAt: base.Add(time.Duration(i) * time.Second),
			Message: broker.Message{ID: strings.Repeat("m", 10_000) + fmt.Sprint(i), Topic: "orders",
				Headers: map[string]string{"x-big": strings.Repeat("h", 64<<10), strings.Repeat("n", 64<<10): "v"}}}
		if i == 19 {
			dl.Message.Topic, dl.Subscriber, dl.Error = evil, evil, evil
		}
		require.NoError(t, s.b.DeadLetters().Put(context.Background(), dl))
	}
	s.subscribe(t, evil, evil, func(context.Context, broker.Message) error { return nil })
	return s, evil
}

// fits reports the page's width beyond the window (0 when nothing is off
// screen to the right).
const overflow = `Math.round(document.documentElement.scrollWidth - window.innerWidth)`

// TestHostileFieldsFitTheWindow: at desktop width, neither the list nor
// the detail page is wider than the window (a 64 KiB header made the page
// 493,293 px wide; a 10 KB message ID broke the list).
func TestHostileFieldsFitTheWindow(t *testing.T) {
	s, _ := hostileSite(t)
	br := newBrowser(t)
	br.do(t, chromedp.EmulateViewport(1280, 800))
	for _, path := range []string{"deadletters", "deadletters/dl-0", ""} {
		br.open(t, s.admin+path)
		assert.LessOrEqual(t, eval[int](t, br, overflow), 0, "/%s is wider than the window", path)
	}
	br.open(t, s.admin+"deadletters")
	assert.Equal(t, 20, eval[int](t, br, `document.querySelectorAll('#dead-letters tbody tr').length`))
	h := eval[int](t, br, `Math.round(Math.max(...Array.from(document.querySelectorAll('#dead-letters tbody tr')).map(r => r.getBoundingClientRect().height)))`)
	assert.Less(t, h, 400, "a row is %d px high", h)
}

// TestPhoneWidth: at 390×844 the dead-letter list shows every field of a
// row on screen (stacked), the error column is not a letter wide, and the
// overview shows each subscriber's dead letters, retries and breaker on
// screen.
func TestPhoneWidth(t *testing.T) {
	s, evil := hostileSite(t)
	br := newBrowser(t)
	br.do(t, chromedp.EmulateViewport(390, 844))
	br.open(t, s.admin+"deadletters")
	assert.LessOrEqual(t, eval[int](t, br, overflow), 0, "the list is wider than the phone")
	// Every cell of the first row lies within the screen's width.
	cells := eval[[]map[string]float64](t, br, `Array.from(document.querySelectorAll('#dead-letters tbody tr:first-child td')).map(c => {
		const r = c.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width, height: r.height}; })`)
	require.Len(t, cells, 9)
	for i, c := range cells {
		assert.GreaterOrEqual(t, c["left"], 0.0, "cell %d starts off screen", i)
		assert.LessOrEqual(t, c["right"], 390.0, "cell %d ends off screen", i)
	}
	errCell := eval[map[string]float64](t, br, `(() => { const r = document.querySelector('#dead-letters tbody tr:first-child td.error').getBoundingClientRect(); return {width: r.width, height: r.height}; })()`)
	assert.Greater(t, errCell["width"], 300.0, "the error column is %v px wide", errCell["width"])

	br.open(t, s.admin)
	assert.LessOrEqual(t, eval[int](t, br, overflow), 0, "the overview is wider than the phone")
	for _, field := range []string{"dead_lettered", "retries", "breaker"} {
		right := eval[float64](t, br, `document.querySelector('tr[data-subscriber] [data-field=`+field+`]').getBoundingClientRect().right`)
		assert.LessOrEqual(t, right, 390.0, "%s is off screen", field)
		assert.Greater(t, right, 0.0, "%s is not shown", field)
	}
	_ = evil
}

// TestBidiOverrideNeutralised: a topic, subscriber and error holding
// U+202E render as "bidi-[U+202E]evil", not reversed ("bidi-live"), on the
// list and on the overview, after its script refreshed it too.
func TestBidiOverrideNeutralised(t *testing.T) {
	s, evil := hostileSite(t)
	br := newBrowser(t)
	br.open(t, s.admin+"deadletters")
	row := `#dead-letters tr[data-dead-letter="dl-19"]`
	for _, label := range []string{"Topic", "Subscriber", "Error"} {
		text := eval[string](t, br, `document.querySelector('`+row+` td[data-label="`+label+`"]').textContent`)
		assert.Equal(t, "bidi-[U+202E]evil", text, label)
	}
	br.open(t, s.admin)
	br.waitJS(t, `document.getElementById('sampled-at').dataset.refreshed || true`)
	assert.Equal(t, "bidi-[U+202E]evil", eval[string](t, br, `document.querySelector('section.topic .topic-name').textContent`))
	assert.NotContains(t, eval[string](t, br, `document.body.innerText`), "\u202e")
	_ = evil
}
