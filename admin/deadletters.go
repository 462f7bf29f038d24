package admin

import (
	"context"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/inproc/broker"
)

// listQuery is a dead-letter list request: the filter form's fields.
type listQuery struct {
	Topic, Subscriber, Code, Reason string
	MessageID                       string
	Since, Until                    time.Time // FailedAt range; zero: unbounded
	Oldest                          bool      // oldest first (the default is newest first)
	Limit, Offset                   int
}

// timeLayouts are what since and until accept: RFC 3339, or what an
// <input type="datetime-local"> sends (taken as UTC, as the page shows
// times).
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04"}

func parseTime(name, s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s %q: want a time such as 2026-12-01T14:30 (UTC) or RFC 3339", name, cut(40, s))
}

// parseListQuery reads the query parameters topic, subscriber, code,
// reason, message_id, since, until, order (newest or oldest), limit and
// offset.
func (h *Handler) parseListQuery(v url.Values) (listQuery, error) {
	q := listQuery{
		Topic:      v.Get("topic"),
		Subscriber: v.Get("subscriber"),
		Code:       v.Get("code"),
		Reason:     v.Get("reason"),
		MessageID:  v.Get("message_id"),
		Limit:      h.opts.PageSize,
	}
	switch o := v.Get("order"); o {
	case "", "newest":
	case "oldest":
		q.Oldest = true
	default:
		return q, fmt.Errorf("order %q: want newest or oldest", cut(40, o))
	}
	var err error
	if s := v.Get("since"); s != "" {
		if q.Since, err = parseTime("since", s); err != nil {
			return q, err
		}
	}
	if s := v.Get("until"); s != "" {
		if q.Until, err = parseTime("until", s); err != nil {
			return q, err
		}
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Until.After(q.Since) {
		return q, fmt.Errorf("until %s is not after since %s", fmtTime(q.Until), fmtTime(q.Since))
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxPageSize {
			return q, fmt.Errorf("limit %q: want a number from 1 to %d", s, MaxPageSize)
		}
		q.Limit = n
	}
	if s := v.Get("offset"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return q, fmt.Errorf("offset %q: want a number from 0", s)
		}
		q.Offset = n
	}
	if q.Offset+q.Limit > h.opts.MaxScan {
		return q, fmt.Errorf("offset %d + limit %d: pages reach at most %d dead letters (Options.MaxScan); narrow the filter", q.Offset, q.Limit, h.opts.MaxScan)
	}
	return q, nil
}

// values is q as query parameters (without paging), for links.
func (q listQuery) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"topic": q.Topic, "subscriber": q.Subscriber, "code": q.Code, "reason": q.Reason, "message_id": q.MessageID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for k, t := range map[string]time.Time{"since": q.Since, "until": q.Until} {
		if !t.IsZero() {
			v.Set(k, t.Format(time.RFC3339Nano))
		}
	}
	if q.Oldest {
		v.Set("order", "oldest")
	}
	return v
}

// storeQuery is q for the store.
func (q listQuery) storeQuery() broker.DeadLetterQuery {
	return broker.DeadLetterQuery{
		DeadLetterFilter: broker.DeadLetterFilter{Topic: q.Topic, Subscriber: q.Subscriber, ErrorCode: q.Code, Reason: q.Reason},
		MessageID:        q.MessageID, Since: q.Since, Until: q.Until,
	}
}

// list returns one page of the dead letters matching q. Newest first (the
// default), broker.ListNewest reads from the store's newest end (a store
// that is no broker.DeadLetterLister is read whole through List). Oldest
// first, the store's List filters by topic, subscriber, code and reason;
// a message ID or time range is filtered here, over at most MaxScan of
// them. Each read asks for one more than it uses, to know whether there
// are more; what the store returns is matched again (a store may ignore a
// filter field it predates).
func (h *Handler) list(ctx context.Context, q listQuery) (DeadLetterList, error) {
	store := h.b.DeadLetters()
	sq := q.storeQuery()
	scan := q.Offset + q.Limit
	var dls []broker.DeadLetter
	var err error
	out := DeadLetterList{Offset: q.Offset, Limit: q.Limit, Stored: -1, DeadLetters: []DeadLetterSummary{}, NewestFirst: !q.Oldest}
	if q.Oldest {
		f := sq.DeadLetterFilter
		local := q.MessageID != "" || !q.Since.IsZero() || !q.Until.IsZero()
		if local {
			scan = h.opts.MaxScan
		}
		f.Limit = scan + 1
		dls, err = store.List(ctx, f)
		if local {
			out.Truncated = len(dls) > scan
			dls = dls[:min(len(dls), scan)] // also for a store that ignores Limit
		}
	} else {
		sq.Limit = scan + 1
		dls, err = broker.ListNewest(ctx, store, sq)
	}
	if err != nil {
		return DeadLetterList{}, fmt.Errorf("admin: list dead letters: %w", err)
	}
	n := 0 // matches so far (the store's slice is not modified)
	for _, dl := range dls {
		if !sq.Match(dl) {
			continue
		}
		if n >= q.Offset && n < q.Offset+q.Limit {
			out.DeadLetters = append(out.DeadLetters, listSummary(dl))
		}
		n++
	}
	out.More = n > q.Offset+q.Limit
	if n, err := store.Len(ctx); err == nil {
		out.Stored = n
	}
	return out, nil
}

// listSummary is summary with the error cut to ListErrorLimit bytes: a
// list of 50 dead letters with 256 KiB errors each would be 13 MB.
func listSummary(dl broker.DeadLetter) DeadLetterSummary {
	s := summary(dl)
	if len(s.Error) > ListErrorLimit {
		s.Error = cutBytes(s.Error, ListErrorLimit)
		s.ErrorTruncated = true
	}
	return s
}

func summary(dl broker.DeadLetter) DeadLetterSummary {
	return DeadLetterSummary{
		ID:          dl.ID,
		Topic:       dl.Message.Topic,
		Subscriber:  dl.Subscriber,
		MessageID:   dl.Message.ID,
		Key:         dl.Message.Key,
		Attempts:    dl.Attempts,
		ErrorCode:   dl.ErrorCode,
		Error:       dl.Error,
		Retryable:   dl.Retryable,
		Reason:      dl.Reason,
		FailedAt:    dl.FailedAt,
		PublishedAt: dl.Message.PublishedAt,
		PayloadSize: len(dl.Message.Payload),
		ErrorSize:   len(dl.Error),
	}
}

// detail is the whole of dl, its payload as text when printable (and
// base64 false), else as bytes: one encoding, not both (a 5 MiB payload
// made a 12 MB answer with both).
func detail(dl broker.DeadLetter, base64 bool) DeadLetterDetail {
	d := DeadLetterDetail{
		DeadLetterSummary: summary(dl),
		Attempt:           dl.Message.Attempt,
		Headers:           dl.Message.Headers,
	}
	if d.Headers == nil {
		d.Headers = map[string]string{}
	}
	if !base64 && printable(dl.Message.Payload) {
		s := string(dl.Message.Payload)
		d.PayloadText = &s
	} else {
		d.Payload = dl.Message.Payload
		if d.Payload == nil {
			d.Payload = []byte{}
		}
	}
	return d
}

// printable reports whether p is valid UTF-8 made of graphic characters,
// spaces, tabs and line breaks only: no control or format characters (such
// as the bidirectional overrides), which are shown as hex instead.
func printable(p []byte) bool {
	if !utf8.Valid(p) {
		return false
	}
	for _, r := range string(p) {
		if !unicode.IsGraphic(r) && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
	}
	return true
}

// payloadView is a payload as the detail page shows it: at most limit
// bytes, as text or as a hex dump.
type payloadView struct {
	Size, Shown int
	IsText      bool
	Text        string // escaped by the template
	Hex         string // hex.Dump of the shown bytes
}

func viewPayload(p []byte, limit int) payloadView {
	v := payloadView{Size: len(p)}
	shown := p[:min(len(p), limit)]
	if len(shown) < len(p) { // do not cut a character in two
		for i := 0; i < utf8.UTFMax-1 && len(shown) > 0 && !utf8.Valid(shown); i++ {
			shown = shown[:len(shown)-1]
		}
	}
	if len(p) == 0 || printable(shown) {
		v.IsText, v.Text = true, string(shown)
	} else {
		shown = p[:min(len(p), limit)]
		v.Hex = hex.Dump(shown)
	}
	v.Shown = len(shown)
	return v
}

// headerView is one header, for a table sorted by name.
type headerView struct{ Name, Value string }

func viewHeaders(hd map[string]string) []headerView {
	out := make([]headerView, 0, len(hd))
	for _, k := range slices.Sorted(maps.Keys(hd)) {
		out = append(out, headerView{k, hd[k]})
	}
	return out
}

// listPage is the data of the deadletters page.
type listPage struct {
	page
	Q            listQuery
	List         DeadLetterList
	Topics       []string // for the topic filter's suggestions
	Reasons      []string
	Codes        []string
	Prev, Next   string // links; "" when none
	First        int    // 1-based position of the first shown
	Last         int
	MaxScan      int
	SelectAll    bool // check every box (the no-JS "select all" link)
	SelectAllURL string
	APIURL       string
	Notice       string
	NoticeBad    bool
	NoticeDone   string
	// Matching is how many dead letters match the filter, for "redrive all
	// matching" and "delete all matching" (0: not offered: none, or a
	// message ID or time range in the filter); MatchingMore says there are
	// more than Matching (MaxScan).
	Matching     int
	MatchingMore bool
}

var reasons = []string{broker.ReasonExhausted, broker.ReasonPermanent, broker.ReasonShutdown,
	broker.ReasonUnsubscribed, broker.ReasonOverflow, broker.ReasonBudget}

var codes = []string{broker.CodeError, broker.CodeTimeout, broker.CodePanic, broker.CodePermanent,
	broker.CodeThrottled, broker.CodeShutdown, broker.CodeUnsubscribed, broker.CodeOverflow}

// deadLetters serves GET deadletters: the filter form and one page.
func (h *Handler) deadLetters(w http.ResponseWriter, r *http.Request) {
	q, err := h.parseListQuery(r.URL.Query())
	if err != nil {
		h.fail(w, r, false, http.StatusBadRequest, err.Error())
		return
	}
	list, err := h.list(r.Context(), q)
	if err != nil {
		h.fail(w, r, false, http.StatusInternalServerError, err.Error())
		return
	}
	p := listPage{
		page:      h.newPage(w, r, "deadletters", "Dead letters", ""),
		Q:         q,
		List:      list,
		Topics:    slices.Sorted(maps.Keys(h.b.Stats().Topics)),
		Reasons:   reasons,
		Codes:     codes,
		First:     q.Offset + 1,
		Last:      q.Offset + len(list.DeadLetters),
		MaxScan:   h.opts.MaxScan,
		SelectAll: r.URL.Query().Get("select") == "all",
	}
	if q.Reason != "" && !slices.Contains(reasons, q.Reason) {
		p.Reasons = append(slices.Clip(reasons), q.Reason) // keep a reason of a custom store selected
	}
	query := func(offset int) url.Values {
		v := q.values()
		if q.Limit != h.opts.PageSize {
			v.Set("limit", strconv.Itoa(q.Limit))
		}
		if offset > 0 {
			v.Set("offset", strconv.Itoa(offset))
		}
		return v
	}
	withQuery := func(path string, v url.Values) string {
		if len(v) == 0 {
			return path
		}
		return path + "?" + v.Encode()
	}
	link := func(offset int) string { return withQuery("deadletters", query(offset)) }
	all := query(q.Offset)
	all.Set("select", "all")
	p.SelectAllURL = withQuery("deadletters", all)
	p.APIURL = withQuery("api/deadletters", query(q.Offset))
	if q.Offset > 0 {
		p.Prev = link(max(0, q.Offset-q.Limit))
	}
	if list.More && q.Offset+2*q.Limit <= h.opts.MaxScan {
		p.Next = link(q.Offset + q.Limit)
	}
	p.Notice, p.NoticeBad, p.NoticeDone = notice(r.URL.Query())
	if f, ok := q.matchingFilter(); ok && p.AllowActions && (p.Can[ActionRedriveMatching] || p.Can[ActionDeleteMatching]) && len(list.DeadLetters) > 0 {
		if n, err := h.countMatching(r, f, h.opts.MaxScan); err == nil {
			p.Matching, p.MatchingMore = min(n, h.opts.MaxScan), n > h.opts.MaxScan
		}
	}
	h.render(w, http.StatusOK, "deadletters", p)
}

// notice states the result of the action a form redirected from, from the
// done, ok, failed and why parameters (numbers and known codes only: no
// text from the URL reaches the page).
func notice(v url.Values) (text string, bad bool, done string) {
	var verb string
	switch done = v.Get("done"); done {
	case string(actionRedrive), ActionRedriveMatching:
		verb = "Redrove"
	case string(actionDelete), ActionDeleteMatching:
		verb = "Deleted"
	default:
		return "", false, ""
	}
	ok, _ := strconv.Atoi(v.Get("ok"))
	failed, _ := strconv.Atoi(v.Get("failed"))
	if ok == 0 && failed == 0 {
		return "Nothing selected.", false, done
	}
	text = fmt.Sprintf("%s %d dead letter%s.", verb, ok, plural(ok))
	if failed > 0 {
		bad = true
		text += fmt.Sprintf(" %d failed", failed)
		if why, known := failureText[v.Get("why")]; known {
			text += ": " + why
		}
		text += "."
	}
	return text, bad, done
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// detailPage is the data of the deadletters/{id} page.
type detailPage struct {
	page
	DL      DeadLetterSummary
	Error   string // DL.Error, at most PayloadLimit bytes of it
	Attempt int
	Headers []headerView
	Payload payloadView
}

// deadLetter serves GET deadletters/{id}.
func (h *Handler) deadLetter(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	dl, ok, err := h.b.DeadLetters().Get(r.Context(), id)
	switch {
	case err != nil:
		h.fail(w, r, false, http.StatusInternalServerError, fmt.Sprintf("get dead letter %q: %v", id, err))
		return
	case !ok:
		h.fail(w, r, false, http.StatusNotFound, fmt.Sprintf("no dead letter %q (redriven or deleted?)", id))
		return
	}
	h.render(w, http.StatusOK, "deadletter", detailPage{
		page:    h.newPage(w, r, "deadletter", "Dead letter "+id, "../"),
		DL:      summary(dl),
		Error:   cutBytes(dl.Error, h.opts.PayloadLimit),
		Attempt: dl.Message.Attempt,
		Headers: viewHeaders(dl.Message.Headers),
		Payload: viewPayload(dl.Message.Payload, h.opts.PayloadLimit),
	})
}

// apiDeadLetters serves GET api/deadletters.
func (h *Handler) apiDeadLetters(w http.ResponseWriter, r *http.Request) {
	q, err := h.parseListQuery(r.URL.Query())
	if err != nil {
		h.fail(w, r, true, http.StatusBadRequest, err.Error())
		return
	}
	list, err := h.list(r.Context(), q)
	if err != nil {
		h.fail(w, r, true, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, list)
}

// apiDeadLetter serves GET api/deadletters/{id}.
func (h *Handler) apiDeadLetter(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	dl, ok, err := h.b.DeadLetters().Get(r.Context(), id)
	switch {
	case err != nil:
		h.fail(w, r, true, http.StatusInternalServerError, fmt.Sprintf("get dead letter %q: %v", id, err))
	case !ok:
		h.fail(w, r, true, http.StatusNotFound, fmt.Sprintf("no dead letter %q", id))
	default:
		switch enc := r.URL.Query().Get("payload"); enc {
		case "", "base64":
			writeJSON(w, http.StatusOK, detail(dl, enc == "base64"))
		default:
			h.fail(w, r, true, http.StatusBadRequest, fmt.Sprintf("payload %q: want base64 or nothing", cut(40, enc)))
		}
	}
}

// pathEscape escapes s as one path segment: everything but unreserved
// characters is percent-encoded, and "." and ".." (which a browser or
// ServeMux would resolve) are written as %2E.
func pathEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '~' || c == '.' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	if e := b.String(); e != "." && e != ".." {
		return e
	}
	return strings.Repeat("%2E", len(s))
}
