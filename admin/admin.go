package admin

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/inproc/broker"
)

// Defaults and limits of Options.
const (
	DefaultTitle          = "broker admin"
	DefaultSampleInterval = 2 * time.Second        // least time between two samples; the overview's refresh period
	MinSampleInterval     = 100 * time.Millisecond // shortest SampleInterval accepted
	DefaultHistory        = 120                    // samples per topic chart
	MaxHistory            = 10_000                 // most samples per topic chart
	DefaultPageSize       = 50                     // dead letters per list page
	MaxPageSize           = 1000                   // most dead letters per list page (the limit parameter)
	DefaultMaxScan        = 10_000                 // most dead letters one list request reads
	DefaultPayloadLimit   = 64 << 10               // payload bytes the detail page shows
	ListErrorLimit        = 1 << 10                // bytes of each error a list (page or JSON) carries
	FieldLimit            = 200                    // characters of a topic, subscriber, ID, code or key a list shows; 16× that on the detail page
	MaxActionIDs          = 1000                   // most dead-letter IDs one action request may name
	maxActionBody         = 1 << 20                // bytes of an action request's body
)

// ErrInvalidOption is wrapped by the error New returns for a bad argument.
var ErrInvalidOption = errors.New("admin: invalid option")

// Options configures a Handler. The zero value is a read-only page with the
// defaults; negative numbers are refused.
type Options struct {
	// AllowActions enables redrive and delete. Off (the default), the pages
	// show no action buttons and every action request is refused with 403
	// Forbidden.
	AllowActions bool
	// Title names the pages, for example after the service (default
	// DefaultTitle).
	Title string
	// SampleInterval is the least time between two samples of Stats (which
	// give the rates and the charts), and how often the overview refreshes
	// itself (default DefaultSampleInterval; at least MinSampleInterval).
	SampleInterval time.Duration
	// SampleInBackground makes New start a goroutine that samples Stats
	// every SampleInterval until Close, so the charts have a history before
	// anyone looks. Without it the handler samples when the overview or
	// api/stats is requested, and starts no goroutine.
	SampleInBackground bool
	// History is how many samples each live topic's chart keeps (default
	// DefaultHistory, at most MaxHistory).
	History int
	// PageSize is how many dead letters a list shows when the request sets
	// no limit (default DefaultPageSize, at most MaxPageSize).
	PageSize int
	// MaxScan bounds how far one list request pages (default
	// DefaultMaxScan): a request whose offset + limit passes it is refused
	// (400). Oldest first with a message ID or time range, which the
	// handler filters itself, it reads at most MaxScan of the store's
	// matches (newest first, the store's ListNewest does the filtering).
	// It also bounds "all matching" actions. It is raised to PageSize if
	// lower.
	MaxScan int
	// PayloadLimit is how many bytes of a payload the detail page shows
	// (default DefaultPayloadLimit); the full size is stated beside it.
	PayloadLimit int
	// TrustedOrigins are origins ("https://ops.example.com") allowed to send
	// action requests although their host is not the request's Host, for
	// a handler behind a proxy that rewrites Host.
	TrustedOrigins []string
	// Logger receives a line per action and per refused action request
	// (default slog.Default()).
	Logger *slog.Logger
	// Authorize, when set, is asked before every action (with AllowActions):
	// a non-nil error refuses it with 403 Forbidden, and a page shows the
	// action buttons only to a request Authorize allows some action. So one
	// handler serves a read-only role and an actions role, say by a header
	// the authenticating proxy sets. The action is one of ActionRedrive,
	// ActionDelete, ActionRedriveMatching, ActionDeleteMatching. It must be
	// safe for concurrent use; a panic counts as a refusal.
	Authorize func(r *http.Request, action string) error
	// SecureCookie marks the CSRF cookie Secure even on plain HTTP: for a
	// handler behind a proxy that terminates TLS (the cookie is Secure
	// anyway when the request came over TLS).
	SecureCookie bool
	// TrustForwardedProto marks the CSRF cookie Secure when the request
	// has X-Forwarded-Proto: https. Set it only behind a proxy that sets
	// that header itself (a client could send it otherwise).
	TrustForwardedProto bool
}

// Actions, as Options.Authorize is asked about them.
const (
	ActionRedrive         = "redrive"          // redrive the selected dead letters
	ActionDelete          = "delete"           // delete the selected dead letters
	ActionRedriveMatching = "redrive_matching" // redrive every dead letter matching a filter
	ActionDeleteMatching  = "delete_matching"  // delete every dead letter matching a filter
)

// Handler is the admin page: an http.Handler serving the pages, the JSON
// endpoints and the embedded assets of the package doc. Create it with New;
// it is safe for concurrent use. Close ends its background sampler, if any.
type Handler struct {
	b    *broker.Broker
	opts Options
	mux  *http.ServeMux
	cop  *http.CrossOriginProtection
	key  []byte // HMAC key of the CSRF tokens
	samp *sampler

	stop      chan struct{}  // closed by Close
	done      sync.WaitGroup // the background sampler
	closeOnce sync.Once
}

// New returns the admin page of b. It fails with an error wrapping
// ErrInvalidOption when b is nil or an option is out of range.
func New(b *broker.Broker, opts Options) (*Handler, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: nil broker", ErrInvalidOption)
	}
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	h := &Handler{
		b:    b,
		opts: opts,
		cop:  http.NewCrossOriginProtection(),
		key:  make([]byte, 32),
		samp: newSampler(opts.SampleInterval, opts.History),
		stop: make(chan struct{}),
	}
	for _, o := range opts.TrustedOrigins {
		if err := h.cop.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("%w: trusted origin %q: %v", ErrInvalidOption, o, err)
		}
	}
	rand.Read(h.key) // never fails (crypto/rand since Go 1.24)
	h.routes()
	if opts.SampleInBackground {
		h.done.Go(h.sampleLoop)
	}
	return h, nil
}

func (o *Options) normalize() error {
	switch {
	case o.SampleInterval < 0:
		return fmt.Errorf("%w: negative SampleInterval %v", ErrInvalidOption, o.SampleInterval)
	case o.SampleInterval > 0 && o.SampleInterval < MinSampleInterval:
		return fmt.Errorf("%w: SampleInterval %v is below %v", ErrInvalidOption, o.SampleInterval, MinSampleInterval)
	case o.History < 0 || o.History > MaxHistory:
		return fmt.Errorf("%w: History %d is not within 0..%d", ErrInvalidOption, o.History, MaxHistory)
	case o.PageSize < 0 || o.PageSize > MaxPageSize:
		return fmt.Errorf("%w: PageSize %d is not within 0..%d", ErrInvalidOption, o.PageSize, MaxPageSize)
	case o.MaxScan < 0:
		return fmt.Errorf("%w: negative MaxScan %d", ErrInvalidOption, o.MaxScan)
	case o.PayloadLimit < 0:
		return fmt.Errorf("%w: negative PayloadLimit %d", ErrInvalidOption, o.PayloadLimit)
	}
	if o.Title == "" {
		o.Title = DefaultTitle
	}
	if o.SampleInterval == 0 {
		o.SampleInterval = DefaultSampleInterval
	}
	if o.History == 0 {
		o.History = DefaultHistory
	}
	if o.PageSize == 0 {
		o.PageSize = DefaultPageSize
	}
	if o.MaxScan == 0 {
		o.MaxScan = DefaultMaxScan
	}
	if o.MaxScan < o.PageSize {
		o.MaxScan = o.PageSize
	}
	if o.PayloadLimit == 0 {
		o.PayloadLimit = DefaultPayloadLimit
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.TrustedOrigins = append([]string(nil), o.TrustedOrigins...)
	return nil
}

// Close ends the background sampler (Options.SampleInBackground) and waits
// for it. The handler goes on serving requests, sampling on them. Calling
// Close again does nothing; it always returns nil.
func (h *Handler) Close() error {
	h.closeOnce.Do(func() { close(h.stop) })
	h.done.Wait()
	return nil
}

// sampleLoop samples Stats every SampleInterval until Close.
func (h *Handler) sampleLoop() {
	t := time.NewTicker(h.opts.SampleInterval)
	defer t.Stop()
	h.samp.observe(h.b.Stats(), time.Now())
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			h.samp.observe(h.b.Stats(), time.Now())
		}
	}
}

func (h *Handler) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", h.overview)
	m.HandleFunc("GET /deadletters", h.deadLetters)
	m.HandleFunc("GET /deadletters/{id}", h.deadLetter)
	m.HandleFunc("POST /redrive", h.formAction(actionRedrive))
	m.HandleFunc("POST /delete", h.formAction(actionDelete))
	m.HandleFunc("POST /redrive-matching", h.matchingAction(ActionRedriveMatching))
	m.HandleFunc("POST /delete-matching", h.matchingAction(ActionDeleteMatching))
	m.HandleFunc("GET /api/stats", h.apiStats)
	m.HandleFunc("GET /api/deadletters", h.apiDeadLetters)
	m.HandleFunc("GET /api/deadletters/{id}", h.apiDeadLetter)
	m.HandleFunc("GET /api/token", h.apiToken)
	m.HandleFunc("POST /api/redrive", h.apiAction(actionRedrive))
	m.HandleFunc("POST /api/delete", h.apiAction(actionDelete))
	m.HandleFunc("GET /static/{name}", serveStatic)
	h.mux = m
}

// ServeHTTP serves the admin pages, JSON endpoints and assets. Paths are
// relative to where the handler is mounted: strip any prefix with
// http.StripPrefix (with or without its trailing slash).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	if !strings.HasPrefix(r.URL.Path, "/") { // http.StripPrefix("/admin/") leaves "deadletters"
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path = "/" + u.Path
		if u.RawPath != "" {
			u.RawPath = "/" + u.RawPath
		}
		r2.URL = &u
		r = r2
	}
	if !h.routed(r) {
		h.fail(w, r, strings.HasPrefix(r.URL.Path, "/api/"), http.StatusNotFound, "no such page: "+r.URL.Path)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// routed reports whether the mux has a route for r's path: for r's method,
// or for another (then the mux answers 405 with Allow). An unknown path
// gets the handler's own error page (or JSON under api/), not the mux's
// plain-text 404. The routes use GET (HEAD with it) and POST only: a route
// with another method must be added to the list below.
func (h *Handler) routed(r *http.Request) bool {
	if _, pattern := h.mux.Handler(r); pattern != "" {
		return true
	}
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		r2 := *r
		r2.Method = m
		if _, pattern := h.mux.Handler(&r2); pattern != "" {
			return true
		}
	}
	return false
}

// csp allows the embedded script and style only: no inline script or
// style, no framing, forms and fetches to this origin only.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

func securityHeaders(hd http.Header) {
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	hd.Set("Cross-Origin-Resource-Policy", "same-origin")
}
