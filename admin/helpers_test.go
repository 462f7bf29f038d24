package admin

import (
	"context"
	"encoding/json"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inproc/broker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// discard is a logger that writes nowhere.
var discard = slog.New(slog.DiscardHandler)

// newBroker returns a broker with a silent logger and retries without
// backoff, closed when the test ends.
func newBroker(t *testing.T, opts ...broker.Option) *broker.Broker {
	t.Helper()
	base := []broker.Option{broker.WithLogger(discard),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(0)})}
	b, err := broker.New(append(base, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

// newHandler returns the admin handler of b with a silent logger, closed
// when the test ends.
func newHandler(t *testing.T, b *broker.Broker, o Options) *Handler {
	t.Helper()
	if o.Logger == nil {
		o.Logger = discard
	}
	h, err := New(b, o)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Close()) })
	return h
}

// do sends req to h and returns the response.
func do(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// get sends GET target to h.
func get(h http.Handler, target string) *httptest.ResponseRecorder {
	return do(h, httptest.NewRequest(http.MethodGet, target, nil))
}

// getOK sends GET target to h and requires 200.
func getOK(t *testing.T, h http.Handler, target string) string {
	t.Helper()
	w := get(h, target)
	require.Equal(t, http.StatusOK, w.Code, "GET %s: %s", target, w.Body.String())
	return w.Body.String()
}

// getJSON sends GET target to h, requires 200 and decodes the body into v,
// refusing fields v does not have.
func getJSON(t *testing.T, h http.Handler, target string, v any) {
	t.Helper()
	w := get(h, target)
	require.Equal(t, http.StatusOK, w.Code, "GET %s: %s", target, w.Body.String())
	require.Contains(t, w.Header().Get("Content-Type"), "application/json")
	decodeStrict(t, w.Body, v)
}

func decodeStrict(t *testing.T, r io.Reader, v any) {
	t.Helper()
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v))
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitDeadLetters waits until b's store holds n dead letters.
func waitDeadLetters(t *testing.T, b *broker.Broker, n int) {
	t.Helper()
	waitFor(t, "dead letters", func() bool {
		got, err := b.DeadLetters().Len(context.Background())
		require.NoError(t, err)
		return got == n
	})
}

// bad is a handler that fails every message permanently.
func bad(context.Context, broker.Message) error { return broker.Permanent(errors.New("bad")) }

// ok is a handler that succeeds.
func ok(context.Context, broker.Message) error { return nil }

// publish publishes a message or fails the test.
func publish(t *testing.T, b *broker.Broker, m broker.Message) {
	t.Helper()
	require.NoError(t, b.Publish(context.Background(), m))
}

// listIDs returns every dead letter's ID in b's store, oldest first.
func listIDs(t *testing.T, b *broker.Broker, f broker.DeadLetterFilter) []string {
	t.Helper()
	dls, err := b.DeadLetters().List(context.Background(), f)
	require.NoError(t, err)
	ids := make([]string, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	return ids
}

// between returns the part of s from the first start (after from) to the
// next end, or "".
func between(s, start, end string) string {
	i := strings.Index(s, start)
	if i < 0 {
		return ""
	}
	rest := s[i:]
	j := strings.Index(rest, end)
	if j < 0 {
		return ""
	}
	return rest[:j+len(end)]
}

// section returns the overview's section of topic.
func section(page, topic string) string {
	return between(page, `<section class="topic" data-topic="`+html.EscapeString(topic)+`"`, "</section>")
}

// row returns the table row of a subscriber in a topic's section.
func row(sec, sub string) string {
	return between(sec, `<tr data-subscriber="`+html.EscapeString(sub)+`"`, "</tr>")
}

var fieldRe = regexp.MustCompile(`data-field="([^"]+)"[^>]*>([^<]*)<`)

// fields returns the text of each data-field element of a piece of page.
func fields(part string) map[string]string {
	out := map[string]string{}
	for _, m := range fieldRe.FindAllStringSubmatch(part, -1) {
		if _, dup := out[m[1]]; !dup {
			out[m[1]] = html.UnescapeString(m[2])
		}
	}
	return out
}

var tokenRe = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// session is a browser's CSRF state: the cookie and the token a page
// embedded.
type session struct {
	cookie *http.Cookie
	token  string
}

// formSession loads target (a page of h) like a browser and returns the
// cookie it set and the token its form embeds.
func formSession(t *testing.T, h http.Handler, target string) session {
	t.Helper()
	w := get(h, target)
	require.Equal(t, http.StatusOK, w.Code)
	m := tokenRe.FindStringSubmatch(w.Body.String())
	require.NotNil(t, m, "no csrf_token in %s", target)
	cs := w.Result().Cookies()
	require.Len(t, cs, 1)
	return session{cookie: cs[0], token: html.UnescapeString(m[1])}
}

// postForm builds a same-origin form POST as a browser sends it.
func (s session) postForm(target string, form url.Values) *http.Request {
	if s.token != "" {
		form.Set("csrf_token", s.token)
	}
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("Origin", "http://"+req.Host)
	if s.cookie != nil {
		req.AddCookie(s.cookie)
	}
	return req
}

// postJSON builds an API action request as a script sends it.
func (s session) postJSON(target string, ids ...string) *http.Request {
	body, _ := json.Marshal(ActionRequest{IDs: ids})
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	if s.token != "" {
		req.Header.Set("X-CSRF-Token", s.token)
	}
	if s.cookie != nil {
		req.AddCookie(s.cookie)
	}
	return req
}

// apiSession gets a token and cookie from api/token, as a script does.
func apiSession(t *testing.T, h http.Handler, prefix string) session {
	t.Helper()
	w := get(h, prefix+"/api/token")
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var tr TokenResponse
	decodeStrict(t, w.Body, &tr)
	require.Equal(t, "X-CSRF-Token", tr.Header)
	cs := w.Result().Cookies()
	require.Len(t, cs, 1)
	return session{cookie: cs[0], token: tr.Token}
}

func unescape(s string) string { return html.UnescapeString(s) }

func itoa(n int) string { return strconv.Itoa(n) }
