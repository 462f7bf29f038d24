package browsertest_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/inproc/broker"
	"github.com/inproc/broker/admin"
	"github.com/inproc/broker/admin/browsertest"
)

const (
	testTimeout = 30 * time.Second // the whole browser of one test
	waitFor     = 10 * time.Second // waiting on the broker's goroutines
	prefix      = "/admin/"        // where the admin page is mounted
)

// discard is a logger that writes nowhere.
var discard = slog.New(slog.DiscardHandler)

// site is a broker with the admin page mounted under prefix on an
// httptest.Server; a test may add pages of its own to mux (same origin).
type site struct {
	b     *broker.Broker
	h     *admin.Handler
	srv   *httptest.Server
	mux   *http.ServeMux
	admin string // srv.URL + prefix

	mu   sync.Mutex
	reqs []request // every request the server answered, in order
}

// request is one request the site answered.
type request struct {
	Method, Path  string
	Status        int
	SecFetchSite  string
	Origin        string
	HasCSRFCookie bool
}

// posts returns the POST requests to path (under the server's root) the
// site answered.
func (s *site) posts(path string) []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []request
	for _, r := range s.reqs {
		if r.Method == http.MethodPost && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// record serves next and logs the request in s.reqs.
func (s *site) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		_, err := r.Cookie("broker_admin_csrf")
		s.mu.Lock()
		s.reqs = append(s.reqs, request{Method: r.Method, Path: r.URL.Path, Status: rec.status,
			SecFetchSite: r.Header.Get("Sec-Fetch-Site"), Origin: r.Header.Get("Origin"), HasCSRFCookie: err == nil})
		s.mu.Unlock()
	})
}

// newSite starts a broker (silent, retries without backoff unless opts say
// otherwise) and its admin page; everything ends with the test.
func newSite(t *testing.T, o admin.Options, opts ...broker.Option) *site {
	t.Helper()
	base := []broker.Option{broker.WithLogger(discard),
		broker.WithRetryPolicy(broker.RetryPolicy{MaxRetries: 1, Backoff: broker.ConstantBackoff(0)})}
	b, err := broker.New(append(base, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		_ = b.Close(ctx) // a *DrainError is fine: tests leave work behind on purpose
	})
	if o.Logger == nil {
		o.Logger = discard
	}
	h, err := admin.New(b, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	mux := http.NewServeMux()
	mux.Handle(prefix, http.StripPrefix(strings.TrimSuffix(prefix, "/"), h))
	s := &site{b: b, h: h, mux: mux}
	s.srv = httptest.NewServer(s.record(mux))
	t.Cleanup(s.srv.Close)
	s.admin = s.srv.URL + prefix
	return s
}

// publish publishes msgs, failing the test on an error.
func (s *site) publish(t *testing.T, msgs ...broker.Message) {
	t.Helper()
	for _, m := range msgs {
		require.NoError(t, s.b.Publish(context.Background(), m), "publish %s", m.ID)
	}
}

// waitQuiet waits until every subscriber has finished what was routed to it
// (nothing queued or in flight anywhere), so that Stats stand still.
func (s *site) waitQuiet(t *testing.T) broker.Stats {
	t.Helper()
	var st broker.Stats
	require.Eventually(t, func() bool {
		st = s.b.Stats()
		for _, ts := range st.Topics {
			if ts.Backlog() != 0 {
				return false
			}
			for _, ss := range ts.Subscribers {
				if ss.Routed != ss.Delivered+ss.Deduplicated+ss.DeadLettered {
					return false
				}
			}
		}
		return true
	}, waitFor, 5*time.Millisecond, "the broker did not go quiet")
	return st
}

// deadLetters returns the store's dead letters, oldest first.
func (s *site) deadLetters(t *testing.T, f broker.DeadLetterFilter) []broker.DeadLetter {
	t.Helper()
	dls, err := s.b.DeadLetters().List(context.Background(), f)
	require.NoError(t, err)
	return dls
}

// waitDeadLetters waits until the store holds n dead letters and returns
// them, oldest first.
func (s *site) waitDeadLetters(t *testing.T, n int) []broker.DeadLetter {
	t.Helper()
	var dls []broker.DeadLetter
	require.Eventually(t, func() bool {
		dls = s.deadLetters(t, broker.DeadLetterFilter{})
		return len(dls) == n
	}, waitFor, 5*time.Millisecond, "want %d dead letters", n)
	return dls
}

// has reports whether the store holds the dead letter id.
func (s *site) has(t *testing.T, id string) bool {
	t.Helper()
	_, ok, err := s.b.DeadLetters().Get(context.Background(), id)
	require.NoError(t, err)
	return ok
}

// coded is a handler error with its own code (broker.ErrorCoder).
type coded struct{ code, text string }

func (e coded) Error() string     { return e.text }
func (e coded) ErrorCode() string { return e.code }

// sink is a subscriber that fails the first delivery of every message
// with fail's error (dead-lettering it when the error is Permanent) and
// takes every later one, such as a redrive; it records what it took.
type sink struct {
	fail func(broker.Message) error // nil: take everything

	mu    sync.Mutex
	tries map[string]int // deliveries per message ID
	got   []string       // IDs taken, in order
}

func newSink(fail func(broker.Message) error) *sink {
	return &sink{fail: fail, tries: map[string]int{}}
}

func (s *sink) handle(_ context.Context, m broker.Message) error {
	s.mu.Lock()
	s.tries[m.ID]++
	first := s.tries[m.ID] == 1
	s.mu.Unlock()
	if first && s.fail != nil {
		if err := s.fail(m); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.got = append(s.got, m.ID)
	s.mu.Unlock()
	return nil
}

// taken returns the IDs the sink took.
func (s *sink) taken() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// subscribe subscribes h to topic as name, failing the test on an error.
func (s *site) subscribe(t *testing.T, topic, name string, h broker.Handler, opts ...broker.SubscribeOption) {
	t.Helper()
	_, err := s.b.Subscribe(topic, name, h, opts...)
	require.NoError(t, err)
}

// browser is one headless Chromium with one tab, ended with the test (at
// the latest after testTimeout). It answers every JavaScript dialog (accept
// or dismiss, as set) and records their messages.
type browser struct {
	ctx    context.Context
	accept atomic.Bool // how the next dialogs are answered

	mu      sync.Mutex
	dialogs []string // messages of the dialogs opened, in order
	opened  chan string
}

// newBrowser starts the browser, or fails (or skips, see browsertest.Require)
// the test when there is none.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := browsertest.Require(t)
	root, cancelRoot := context.WithTimeout(context.Background(), testTimeout)
	alloc, cancelAlloc := browsertest.NewAllocator(root, path)
	ctx, cancelTab := chromedp.NewContext(alloc)
	br := &browser{ctx: ctx, opened: make(chan string, 64)}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancelTab()   // closes the browser (this context started it)
		wg.Wait()     // the dialog handler ends with ctx
		cancelAlloc() // waits for the process and its profile directory
		cancelRoot()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start %s: %v", path, err)
	}
	// An open dialog blocks the page, and so the action that opened it
	// (a click): answer it from another goroutine, which ends when ctx does.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	wg.Go(func() {
		for ev, err := range dialogs {
			if err != nil {
				return
			}
			br.mu.Lock()
			br.dialogs = append(br.dialogs, ev.Message)
			br.mu.Unlock()
			_, err := chromedp.Call(ctx, page.HandleJavaScriptDialog,
				page.HandleJavaScriptDialogParams{Accept: br.accept.Load()})
			if err != nil && ctx.Err() == nil {
				t.Errorf("answer dialog %q: %v", ev.Message, err)
			}
			select {
			case br.opened <- ev.Message:
			default:
			}
		}
	})
	return br
}

// dialogCount returns how many dialogs were opened so far.
func (br *browser) dialogCount() int {
	br.mu.Lock()
	defer br.mu.Unlock()
	return len(br.dialogs)
}

// do runs steps, failing the test on an error.
func (br *browser) do(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(br.ctx, steps...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// open navigates to url and requires a 200 response.
func (br *browser) open(t *testing.T, url string) {
	t.Helper()
	resp, err := chromedp.Run(br.ctx, chromedp.NavigateResponse(url))
	require.NoError(t, err, "open %s", url)
	require.Equal(t, int64(http.StatusOK), resp.Status, "open %s", url)
}

// follow runs a click (or any steps) that navigates, waits for the new page
// to load and returns its status (after redirects).
func (br *browser) follow(t *testing.T, steps ...chromedp.Action[chromedp.Void]) int {
	t.Helper()
	resp, err := chromedp.RunResponse(br.ctx, steps...)
	require.NoError(t, err)
	return int(resp.Status)
}

// eval evaluates a JavaScript expression in the page and decodes its value.
func eval[T any](t *testing.T, br *browser, js string) T {
	t.Helper()
	v, err := chromedp.Run(br.ctx, chromedp.Evaluate[T](js))
	require.NoError(t, err, "evaluate %s", js)
	return v
}

// waitJS waits (at most waitFor) until the JavaScript expression is truthy
// in the page.
func (br *browser) waitJS(t *testing.T, js string) {
	t.Helper()
	_, err := chromedp.Run(br.ctx, chromedp.Poll[chromedp.Void](js,
		chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(waitFor)))
	require.NoError(t, err, "waiting for %s", js)
}

// page returns the body's data-page of the page shown.
func (br *browser) page(t *testing.T) string {
	t.Helper()
	return eval[string](t, br, `document.body.dataset.page`)
}

// rowIDs returns the data-dead-letter IDs of the dead-letter list shown.
func (br *browser) rowIDs(t *testing.T) []string {
	t.Helper()
	return eval[[]string](t, br,
		`Array.from(document.querySelectorAll('#dead-letters tbody tr[data-dead-letter]'), r => r.dataset.deadLetter)`)
}

// attr quotes s for a CSS attribute selector.
func attr(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\a `).Replace(s) + `"`
}
