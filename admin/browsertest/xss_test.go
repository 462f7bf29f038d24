package browsertest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
)

// Markup that runs script if a page writes it unescaped: a script element
// (alert 1) and an image whose error handler runs (alert 2).
const (
	scriptTag = `<script>alert(1)</script>`
	imgTag    = `<img src=x onerror=alert(2)>`
	markup    = scriptTag + imgTag
)

// inertPage is what a page's DOM says about markup in its data.
type inertPage struct {
	Page     string   `json:"page"`
	Images   int      `json:"images"`   // img elements (the admin pages have none)
	ImagesX  int      `json:"imagesX"`  // img[src="x"]
	Scripts  []string `json:"scripts"`  // src of every script element
	Handlers []string `json:"handlers"` // on* attributes anywhere
	Text     string   `json:"text"`     // the body's text content
}

const readInert = `(() => ({
  page: document.body.dataset.page || "",
  images: document.images.length,
  imagesX: document.querySelectorAll('img[src="x"]').length,
  scripts: Array.from(document.scripts, s => s.getAttribute('src') || "(inline)"),
  handlers: Array.from(document.querySelectorAll('*')).flatMap(e =>
    Array.from(e.attributes).filter(a => a.name.startsWith('on')).map(a => e.tagName + '[' + a.name + ']')),
  text: document.body.textContent,
}))()`

// TestMarkupRendersAsText puts markup into a dead letter's message ID,
// topic, subscriber, key, headers, error and payload (and, for a second
// one, its own ID), and checks on the overview, the list and both detail
// pages that it is text: no dialog opens, no img or script element or
// event handler comes from it, and the text shows the literal markup. A
// control page that writes the same markup raw shows that the checks see
// it when it runs.
func TestMarkupRendersAsText(t *testing.T) {
	br := newBrowser(t)

	t.Run("control: raw markup is caught", func(t *testing.T) {
		raw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprint(w, `<!doctype html><title>raw</title><body><p>`+markup+`</p></body>`)
		}))
		defer raw.Close()
		before := br.dialogCount()
		br.accept.Store(true)
		br.open(t, raw.URL)
		got := eval[inertPage](t, br, readInert)
		assert.Equal(t, 1, got.ImagesX, "the raw img is an element")
		assert.Contains(t, got.Scripts, "(inline)", "the raw script is an element")
		assert.Contains(t, got.Handlers, "IMG[onerror]")
		for range 2 { // alert(1) while parsing, alert(2) when the image fails
			select {
			case m := <-br.opened:
				assert.Contains(t, []string{"1", "2"}, m)
			case <-time.After(waitFor):
				t.Fatal("the raw markup opened no dialog")
			}
		}
		assert.Equal(t, before+2, br.dialogCount())
	})

	s := newSite(t, admin.Options{AllowActions: true})
	topic := "topic " + markup
	sub := "sub " + markup
	msg := broker.Message{
		ID:      "id " + markup,
		Topic:   topic,
		Key:     "key " + markup,
		Payload: []byte("payload " + markup),
		Headers: map[string]string{"h-" + markup: "value " + markup, "trace": markup},
	}
	errText := "error " + markup
	s.subscribe(t, topic, sub, func(context.Context, broker.Message) error {
		return broker.Permanent(errors.New(errText))
	})
	s.publish(t, msg)
	made := s.waitDeadLetters(t, 1)[0]
	// A second dead letter whose own ID is markup too (a store may hold any
	// ID): it is in attributes, a hidden field and the detail link's path.
	odd := made
	odd.ID = "dl " + markup
	require.NoError(t, s.b.DeadLetters().Put(context.Background(), odd))

	before := br.dialogCount()
	check := func(t *testing.T, wantPage string, wantText ...string) {
		t.Helper()
		got := eval[inertPage](t, br, readInert)
		require.Equal(t, wantPage, got.Page)
		assert.Zero(t, got.ImagesX, `an img[src="x"] element`)
		assert.Zero(t, got.Images, "an img element")
		assert.Equal(t, []string{prefix + "static/app.js"}, absScripts(got.Scripts), "script elements")
		assert.Empty(t, got.Handlers, "event handler attributes")
		for _, w := range append(wantText, scriptTag, imgTag) {
			assert.Contains(t, got.Text, w, "the text shows it literally")
		}
		assert.Equal(t, before, br.dialogCount(), "dialogs opened")
	}

	t.Run("overview", func(t *testing.T) {
		br.open(t, s.admin)
		check(t, "overview", topic, sub)
		assert.Equal(t, []string{topic}, eval[[]string](t, br, `Array.from(document.querySelectorAll('section.topic'), s => s.dataset.topic)`))
		assert.Equal(t, []string{sub}, eval[[]string](t, br, `Array.from(document.querySelectorAll('tr[data-subscriber]'), r => r.dataset.subscriber)`))
	})

	t.Run("list", func(t *testing.T) {
		br.open(t, s.admin+"deadletters")
		check(t, "deadletters", topic, sub, msg.ID, errText)
		assert.Equal(t, []string{odd.ID, made.ID}, br.rowIDs(t), "newest first")
		assert.Equal(t, []string{odd.ID, made.ID}, eval[[]string](t, br,
			`Array.from(document.querySelectorAll('#dead-letters input[name=id]'), c => c.value)`), "checkbox values")
	})

	for _, d := range []broker.DeadLetter{made, odd} {
		t.Run("detail "+d.ID, func(t *testing.T) {
			br.open(t, s.admin+"deadletters")
			row := `#dead-letters tr[data-dead-letter=` + attr(d.ID) + `]`
			require.Equal(t, 200, br.follow(t, chromedp.Click(chromedp.CSS(row+` a.detail-link`))))
			check(t, "deadletter", d.ID, topic, sub, msg.ID, msg.Key, errText, string(msg.Payload))
			fields := eval[map[string]string](t, br, `Object.fromEntries(Array.from(
				document.querySelectorAll('#dead-letter [data-field]'), e => [e.dataset.field, e.textContent]))`)
			assert.Equal(t, topic, fields["topic"])
			assert.Equal(t, sub, fields["subscriber"])
			assert.Equal(t, msg.ID, fields["message_id"])
			assert.Equal(t, msg.Key, fields["key"])
			assert.Equal(t, d.Error, fields["error"])
			assert.Contains(t, d.Error, errText)
			assert.Equal(t, d.ID, eval[string](t, br, `document.getElementById('dl-id').textContent`))
			assert.Equal(t, d.ID, eval[string](t, br, `document.getElementById('dead-letter').dataset.deadLetter`))
			assert.Equal(t, d.ID, eval[string](t, br, `document.querySelector('#actions-form input[name=id]').value`))
			assert.Equal(t, "text", eval[string](t, br, `document.getElementById('payload').dataset.encoding`))
			assert.Equal(t, string(msg.Payload), eval[string](t, br, `document.getElementById('payload').textContent`))
			headers := eval[map[string]string](t, br, `Object.fromEntries(Array.from(
				document.querySelectorAll('#headers tr[data-header]'), r => [r.dataset.header, r.querySelector('td').textContent]))`)
			assert.Equal(t, msg.Headers, headers)
		})
	}
}

// absScripts returns the script sources as paths from the server's root
// (they are relative to the page: "static/app.js" or "../static/app.js").
func absScripts(srcs []string) []string {
	out := make([]string, len(srcs))
	for i, s := range srcs {
		out[i] = prefix + strings.TrimPrefix(s, "../")
	}
	return out
}
