package admin

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages holds each page's template set: the layout plus the page.
var pages = func() map[string]*template.Template {
	funcs := template.FuncMap{
		"age":     fmtAge,
		"rate":    fmtRate,
		"pct":     fmtPct,
		"when":    fmtTime,
		"clock":   fmtClock,
		"idpath":  pathEscape,
		"breaker": fmtBreaker,
		"cut":     cut,
		"bytes":   fmtBytes,
		"safe":    neutral,
		"field":   func(s string) string { return neutral(cut(FieldLimit, s)) },
		"long":    func(s string) string { return neutral(cut(16*FieldLimit, s)) },
		"local":   fmtLocal,
	}
	out := map[string]*template.Template{}
	for _, name := range []string{"overview", "deadletters", "deadletter", "error"} {
		t := template.Must(template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
		out[name] = t
	}
	return out
}()

// page is what every page's layout needs.
type page struct {
	AppTitle     string          // Options.Title
	Title        string          // this page's
	Page         string          // body's data-page
	Root         string          // relative path from the page to the mount point: "../" per path segment
	AllowActions bool            // actions on, and Authorize allows this request some action
	Can          map[string]bool // by action: Authorize allows it (all true without the hook)
	Token        string          // CSRF token for the forms; "" when actions are off
	RefreshMS    int64           // the overview's refresh period
	RefreshSec   int
}

func (h *Handler) newPage(w http.ResponseWriter, r *http.Request, name, title, root string) page {
	p := page{AppTitle: h.opts.Title, Title: title, Page: name, Root: root, AllowActions: h.canAct(r)}
	if p.AllowActions {
		p.Token = h.token(w, r)
		p.Can = map[string]bool{}
		for _, a := range []string{ActionRedrive, ActionDelete, ActionRedriveMatching, ActionDeleteMatching} {
			p.Can[a] = h.authorize(r, a) == nil
		}
	}
	return p
}

// render executes a page into a buffer first, so that a template error
// gives a clean 500 rather than half a page.
func (h *Handler) render(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := pages[name].ExecuteTemplate(&buf, "layout", data); err != nil {
		h.opts.Logger.Error("admin: render", "page", name, "error", err)
		http.Error(w, "admin: render failed", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorPage is the data of the error page.
type errorPage struct {
	page
	Status  int
	Message string
}

// fail answers an error: as JSON ({"error": …}) for the API, as a page
// otherwise.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, api bool, status int, msg string) {
	msg = "admin: " + msg
	if api {
		writeJSON(w, status, map[string]string{"error": msg})
		return
	}
	root := strings.Repeat("../", strings.Count(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")) // an ID may hold %2F
	p := page{AppTitle: h.opts.Title, Title: http.StatusText(status), Page: "error", Root: root, AllowActions: h.opts.AllowActions}
	h.render(w, status, "error", errorPage{page: p, Status: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v) // escapes <, > and & as \u003c, \u003e, \u0026
	if err != nil {
		http.Error(w, `{"error":"admin: encode failed"}`, http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "application/json; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// snapshot reads Stats and the store's size, sampling if due.
func (h *Handler) snapshot(r *http.Request) Snapshot {
	st := h.b.Stats()
	snap := h.samp.snapshot(st, time.Now())
	snap.DeadLetters = -1
	if n, err := h.b.DeadLetters().Len(r.Context()); err == nil {
		snap.DeadLetters = n
	}
	return snap
}

// overviewPage is the data of the overview.
type overviewPage struct {
	page
	Snap        Snapshot
	Live        []TopicSnapshot
	Retired     []TopicSnapshot
	RetiredMore int
}

// maxRetiredShown bounds the retired topics the overview lists (Stats keep
// up to broker.MaxGoneTopics); api/stats has them all.
const maxRetiredShown = 100

// overview serves GET / (the mount point).
func (h *Handler) overview(w http.ResponseWriter, r *http.Request) {
	snap := h.snapshot(r)
	p := overviewPage{page: h.newPage(w, r, "overview", "Overview", ""), Snap: snap}
	p.RefreshMS = h.opts.SampleInterval.Milliseconds()
	p.RefreshSec = max(1, int(math.Round(h.opts.SampleInterval.Seconds())))
	for _, t := range snap.Topics {
		switch {
		case t.Live:
			p.Live = append(p.Live, t)
		case len(p.Retired) < maxRetiredShown:
			p.Retired = append(p.Retired, t)
		default:
			p.RetiredMore++
		}
	}
	h.render(w, http.StatusOK, "overview", p)
}

// apiStats serves GET api/stats.
func (h *Handler) apiStats(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, h.snapshot(r))
}

// apiToken serves GET api/token: the CSRF token for scripts (and the
// cookie it goes with).
func (h *Handler) apiToken(w http.ResponseWriter, r *http.Request) {
	if !h.opts.AllowActions {
		h.fail(w, r, true, http.StatusForbidden, "forbidden: "+errActionsOff.Error())
		return
	}
	writeJSON(w, http.StatusOK, TokenResponse{Token: h.token(w, r), Header: csrfHeader})
}

// asset is an embedded static file.
type asset struct {
	data  []byte
	ctype string
	etag  string
}

var assets = func() map[string]asset {
	out := map[string]asset{}
	ents, err := fs.ReadDir(staticFS, "static")
	if err != nil {
		panic(err)
	}
	ctypes := map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
	for _, e := range ents {
		b, err := staticFS.ReadFile("static/" + e.Name())
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(b)
		out[e.Name()] = asset{data: b, ctype: ctypes[path.Ext(e.Name())], etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
	}
	return out
}()

// serveStatic serves GET static/{name} from the embedded assets.
func serveStatic(w http.ResponseWriter, r *http.Request) {
	a, ok := assets[r.PathValue("name")]
	if !ok || a.ctype == "" {
		http.NotFound(w, r)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", a.ctype)
	hd.Set("Cache-Control", "no-cache") // revalidate: the ETag makes that cheap
	hd.Set("ETag", a.etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.data))
}

// Formatting shared with static/app.js (keep them alike).

// fmtAge formats seconds: 0, 350ms, 4.2s, 3m07s, 2h05m.
func fmtAge(sec float64) string {
	switch {
	case sec <= 0:
		return "0"
	case sec < 1:
		return strconv.Itoa(int(math.Round(sec*1000))) + "ms"
	case sec < 60:
		return strconv.FormatFloat(sec, 'f', 1, 64) + "s"
	case sec < 3600:
		s := int(sec)
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	}
	m := int(sec) / 60
	return fmt.Sprintf("%dh%02dm", m/60, m%60)
}

// fmtRate formats a rate: "–" when unknown, else 12.3/s.
func fmtRate(r *float64) string {
	if r == nil {
		return "–"
	}
	return strconv.FormatFloat(*r, 'f', 1, 64) + "/s"
}

// fmtPct formats a ratio as a percentage: 5.0%.
func fmtPct(r float64) string { return strconv.FormatFloat(r*100, 'f', 1, 64) + "%" }

func fmtBreaker(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// fmtLocal is t as an <input type="datetime-local"> value, in UTC; "" for
// the zero time.
func fmtLocal(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05")
}

// neutral makes s safe to show next to other text: each bidirectional
// control (the embeddings, overrides and isolates U+202A–U+202E and
// U+2066–U+2069, the marks U+200E, U+200F and U+061C), which would reorder
// what follows it, is shown as its code point instead ("bidi-" U+202E
// "evil" would render as "bidi-live"). Every user-controlled string a page
// shows goes through it; payloads are already hex-dumped when they hold
// such characters.
func neutral(s string) string {
	if !strings.ContainsFunc(s, isBidiControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isBidiControl(r) {
			fmt.Fprintf(&b, "[U+%04X]", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isBidiControl(r rune) bool {
	return r >= 0x202A && r <= 0x202E || r >= 0x2066 && r <= 0x2069 || r == 0x200E || r == 0x200F || r == 0x061C
}

func fmtClock(t time.Time) string { return t.UTC().Format("15:04:05Z") }

func fmtBytes(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// cut shortens s to n runes, with an ellipsis.
// cutBytes is s cut to at most n bytes, not inside a character, with "…"
// when cut.
func cutBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

func cut(n int, s string) string {
	if len(s) <= n {
		return s
	}
	i := 0
	for j := range s {
		if i == n {
			return s[:j] + "…"
		}
		i++
	}
	return s
}
