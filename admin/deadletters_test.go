package admin

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
)

// codeErr is an error with its own code.
type codeErr string

func (e codeErr) Error() string     { return "invalid: " + string(e) }
func (e codeErr) ErrorCode() string { return "invalid" }

// failingBroker returns a broker with five dead letters:
//
//	orders   mailer  permanent  permanent  ×2
//	orders   flaky   error      exhausted  ×2
//	payments mailer  invalid    permanent  ×1
func failingBroker(t *testing.T) *broker.Broker {
	t.Helper()
	b := newBroker(t)
	_, err := b.Subscribe("orders", "mailer", bad)
	require.NoError(t, err)
	_, err = b.Subscribe("orders", "flaky", func(context.Context, broker.Message) error { return errors.New("flaky") })
	require.NoError(t, err)
	_, err = b.Subscribe("payments", "mailer", func(context.Context, broker.Message) error {
		return broker.Permanent(codeErr("no such account"))
	})
	require.NoError(t, err)
	publish(t, b, broker.Message{ID: "o1", Topic: "orders"})
	publish(t, b, broker.Message{ID: "o2", Topic: "orders"})
	publish(t, b, broker.Message{ID: "p1", Topic: "payments"})
	waitDeadLetters(t, b, 5)
	return b
}

// TestDeadLetterFilters: each filter field narrows the list, in the page
// and in the API, and paging cuts it.
func TestDeadLetterFilters(t *testing.T) {
	b := failingBroker(t)
	h := newHandler(t, b, Options{})
	tests := []struct {
		query string
		want  int
		more  bool
	}{
		{"", 5, false},
		{"topic=orders", 4, false},
		{"topic=payments", 1, false},
		{"topic=nope", 0, false},
		{"subscriber=mailer", 3, false},
		{"subscriber=flaky", 2, false},
		{"code=permanent", 2, false},
		{"code=invalid", 1, false},
		{"code=error", 2, false},
		{"reason=exhausted", 2, false},
		{"reason=permanent", 3, false},
		{"topic=orders&reason=permanent", 2, false},
		{"topic=orders&subscriber=mailer&code=permanent&reason=permanent", 2, false},
		{"subscriber=mailer&reason=exhausted", 0, false},
		{"limit=2", 2, true},
		{"limit=2&offset=2", 2, true},
		{"limit=2&offset=4", 1, false},
		{"reason=permanent&limit=2", 2, true},
		{"reason=permanent&limit=2&offset=2", 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			q, err := url.ParseQuery(tt.query)
			require.NoError(t, err)
			var list DeadLetterList
			getJSON(t, h, "/api/deadletters?"+tt.query, &list)
			require.Len(t, list.DeadLetters, tt.want)
			assert.Equal(t, tt.more, list.More)
			assert.Equal(t, 5, list.Stored)
			assert.False(t, list.Truncated)
			for _, dl := range list.DeadLetters {
				for field, got := range map[string]string{"topic": dl.Topic, "subscriber": dl.Subscriber, "code": dl.ErrorCode, "reason": dl.Reason} {
					if want := q.Get(field); want != "" {
						assert.Equal(t, want, got, field)
					}
				}
			}
			page := getOK(t, h, "/deadletters?"+tt.query)
			assert.Equal(t, tt.want, strings.Count(page, "<tr data-dead-letter="))
			for _, dl := range list.DeadLetters {
				assert.Contains(t, page, `data-dead-letter="`+dl.ID+`"`)
			}
			assert.Equal(t, tt.more, strings.Contains(page, `id="page-next"`))
			// The form keeps the filter.
			for _, field := range []string{"topic", "subscriber", "code"} {
				if v := q.Get(field); v != "" {
					assert.Contains(t, page, `name="`+field+`" value="`+v+`"`)
				}
			}
			if v := q.Get("reason"); v != "" {
				assert.Contains(t, page, `<option value="`+v+`" selected>`)
			}
		})
	}
}

func TestDeadLetterListRefusesBadQueries(t *testing.T) {
	b := newBroker(t)
	h := newHandler(t, b, Options{MaxScan: 100})
	for _, q := range []string{"limit=x", "limit=0", "limit=-1", "limit=1001", "offset=-1", "offset=y", "offset=90&limit=20"} {
		t.Run(q, func(t *testing.T) {
			w := get(h, "/api/deadletters?"+q)
			assert.Equal(t, http.StatusBadRequest, w.Code)
			assert.Contains(t, w.Body.String(), `"error":"admin: `)
			w = get(h, "/deadletters?"+q)
			assert.Equal(t, http.StatusBadRequest, w.Code)
			assert.Contains(t, w.Body.String(), `id="error"`)
		})
	}
}

// TestLocalFilterScansAtMostMaxScan: oldest first, a message ID or time
// range is filtered here, over the first MaxScan dead letters the store's
// filter returns, and the answer says when it stopped there; the reason
// goes to the store (no scan), and newest first reads from the newest end.
func TestLocalFilterScansAtMostMaxScan(t *testing.T) {
	b := failingBroker(t) // 5 dead letters
	h := newHandler(t, b, Options{MaxScan: 3, PageSize: 2})
	var list DeadLetterList
	getJSON(t, h, "/api/deadletters?order=oldest&since=2000-01-01T00:00", &list)
	assert.True(t, list.Truncated)
	assert.Len(t, list.DeadLetters, 2)
	getJSON(t, h, "/api/deadletters?order=oldest&since=2000-01-01T00:00&topic=orders&subscriber=flaky", &list)
	assert.False(t, list.Truncated, "2 match the store's filter: all read")
	assert.Len(t, list.DeadLetters, 2)
	assert.Contains(t, getOK(t, h, "/deadletters?order=oldest&since=2000-01-01T00:00"), "Only the oldest 3 matching")
	getJSON(t, h, "/api/deadletters?reason=exhausted&order=oldest", &list)
	assert.False(t, list.Truncated, "the store filters by reason")
	getJSON(t, h, "/api/deadletters?since=2000-01-01T00:00", &list)
	assert.False(t, list.Truncated, "newest first is read from the newest end")
	assert.True(t, list.More)

	exact := newHandler(t, b, Options{MaxScan: 5, PageSize: 2}) // the store holds exactly MaxScan
	getJSON(t, exact, "/api/deadletters?order=oldest&since=2000-01-01T00:00", &list)
	assert.False(t, list.Truncated, "all 5 read: none left unseen")
	assert.Len(t, list.DeadLetters, 2)
	assert.NotContains(t, getOK(t, exact, "/deadletters?order=oldest&since=2000-01-01T00:00"), "Only the oldest")
}

// TestDeadLetterDetail shows every field of a dead letter the broker made.
func TestDeadLetterDetail(t *testing.T) {
	b := newBroker(t)
	h := newHandler(t, b, Options{})
	_, err := b.Subscribe("orders", "mailer", bad)
	require.NoError(t, err)
	publish(t, b, broker.Message{ID: "m-1", Topic: "orders", Key: "customer-7",
		Headers: map[string]string{"traceparent": "00-abc-def-01", "x-tenant": "acme"},
		Payload: []byte("hello,\nworld")})
	waitDeadLetters(t, b, 1)
	id := listIDs(t, b, broker.DeadLetterFilter{})[0]
	dl, _, err := b.DeadLetters().Get(context.Background(), id)
	require.NoError(t, err)

	page := getOK(t, h, "/deadletters/"+pathEscape(id))
	f := fields(page)
	assert.Equal(t, "orders", f["topic"])
	assert.Equal(t, "mailer", f["subscriber"])
	assert.Equal(t, "permanent", f["reason"])
	assert.Equal(t, "1", f["attempts"])
	assert.Equal(t, "permanent: bad", f["error"])
	assert.Equal(t, fmtTime(dl.FailedAt), f["failed_at"])
	assert.Equal(t, fmtTime(dl.Message.PublishedAt), f["published_at"])
	assert.Contains(t, page, "<code>m-1</code>")
	assert.Contains(t, page, "<code>customer-7</code>")
	assert.Contains(t, page, `<tr data-header="traceparent"><th scope="row"><code>traceparent</code></th><td><code>00-abc-def-01</code></td></tr>`)
	assert.Contains(t, page, `<tr data-header="x-tenant">`)
	assert.Contains(t, page, `data-encoding="text">hello,`+"\n"+`world</pre>`)
	assert.Contains(t, page, "12 bytes, as text.")
	assert.NotContains(t, page, `data-action=`, "read-only by default")

	var d DeadLetterDetail
	getJSON(t, h, "/api/deadletters/"+pathEscape(id), &d)
	assert.Equal(t, id, d.ID)
	assert.Equal(t, "m-1", d.MessageID)
	assert.Equal(t, "customer-7", d.Key)
	assert.Equal(t, "permanent", d.ErrorCode)
	assert.Equal(t, 1, d.Attempts)
	assert.Equal(t, 1, d.Attempt)
	assert.False(t, d.Retryable)
	assert.True(t, d.FailedAt.Equal(dl.FailedAt))
	assert.Equal(t, dl.Message.Headers, d.Headers)
	assert.Nil(t, d.Payload, "a printable payload comes once, as text")
	require.NotNil(t, d.PayloadText)
	assert.Equal(t, "hello,\nworld", *d.PayloadText)
	var b64 DeadLetterDetail
	getJSON(t, h, "/api/deadletters/"+pathEscape(id)+"?payload=base64", &b64)
	assert.Equal(t, []byte("hello,\nworld"), b64.Payload, "as base64 on request")
	assert.Nil(t, b64.PayloadText)

	for _, p := range []string{"/deadletters/nope", "/api/deadletters/nope"} {
		assert.Equal(t, http.StatusNotFound, get(h, p).Code, p)
	}
}

// TestPayloadShownSafely: text when printable UTF-8, else a hex dump; at
// most PayloadLimit bytes, with the full size stated.
func TestPayloadShownSafely(t *testing.T) {
	big := strings.Repeat("a", 100<<10)
	tests := []struct {
		name      string
		payload   string
		limit     int
		encoding  string
		shown     string // the <pre>'s content
		size      string // the size line
		jsonText  bool
		wantShown int
	}{
		{"text", "plain text\twith tab", 0, "text", "plain text\twith tab", "19 bytes, as text.", true, 19},
		{"empty", "", 0, "text", "", "0 bytes, as text.", true, 0},
		{"binary", "\x00\x01A\xff", 0, "hex", "00000000  00 01 41 ff                                       |..A.|\n", "4 bytes, as a hex dump", false, 4},
		{"invalid UTF-8", "caf\xe9", 0, "hex", "00000000  63 61 66 e9                                       |caf.|\n", "as a hex dump", false, 4},
		{"terminal escape", "red \x1b[31m", 0, "hex", "00000000  72 65 64 20 1b 5b 33 31  6d                       |red .[31m|\n", "as a hex dump", false, 9},
		{"bidi override", "abc\u202edef", 0, "hex", "00000000  61 62 63 e2 80 ae 64 65  66                       |abc...def|\n", "as a hex dump", false, 9},
		{"unicode", "naïve 日本 ✓", 0, "text", "naïve 日本 ✓", "as text.", true, len("naïve 日本 ✓")},
		{"capped", big, 0, "text", big[:64<<10], "102,400 bytes, showing the first 65,536, as text.", true, 64 << 10},
		{"capped by option", "abcdefgh", 3, "text", "abc", "8 bytes, showing the first 3, as text.", true, 3},
		{"cut before a split character", "ééé", 5, "text", "éé", "6 bytes, showing the first 4, as text.", true, 4},
		{"hex capped", "\x00\x01\x02\x03\x04", 2, "hex", "00000000  00 01                                             |..|\n", "5 bytes, showing the first 2, as a hex dump", false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBroker(t)
			h := newHandler(t, b, Options{PayloadLimit: tt.limit})
			ctx := context.Background()
			require.NoError(t, b.DeadLetters().Put(ctx, broker.DeadLetter{
				ID: "dl", Subscriber: "s", Reason: broker.ReasonPermanent, FailedAt: time.Now(),
				Message: broker.Message{ID: "m", Topic: "t", Payload: []byte(tt.payload)},
			}))
			page := getOK(t, h, "/deadletters/dl")
			pre := between(page, `<pre id="payload"`, "</pre>")
			assert.Contains(t, pre, `data-encoding="`+tt.encoding+`"`)
			body := pre[strings.Index(pre, ">")+1 : len(pre)-len("</pre>")]
			assert.Equal(t, tt.shown, unescape(body))
			assert.Contains(t, page, tt.size)
			assert.Contains(t, page, `data-shown="`+itoa(tt.wantShown)+`"`)

			var d DeadLetterDetail
			getJSON(t, h, "/api/deadletters/dl", &d)
			whole := []byte(d.Payload)
			if d.PayloadText != nil {
				assert.Nil(t, d.Payload, "one encoding")
				whole = []byte(*d.PayloadText)
			}
			assert.Equal(t, []byte(tt.payload), whole, "the API has the whole payload")
			assert.Equal(t, len(tt.payload), d.PayloadSize)
			assert.Equal(t, tt.jsonText, d.PayloadText != nil)
		})
	}
}
