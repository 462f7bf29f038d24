package admin

import (
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inproc/broker"
)

// rlo is U+202E RIGHT-TO-LEFT OVERRIDE: "bidi-" rlo "evil" renders as
// "bidi-live".
const rlo = "\u202e"

// TestBidiControlsNeutralised: a bidirectional override in a dead
// letter's ID, topic, subscriber, message ID, key, code, reason, error or
// header, or in a topic or subscriber name on the overview, reaches no
// page raw: it is shown as [U+202E].
func TestBidiControlsNeutralised(t *testing.T) {
	b := newBroker(t)
	evil := "bidi-" + rlo + "evil"
	putDeadLetters(t, b, 1, func(int) broker.DeadLetter {
		return broker.DeadLetter{ID: "dl-0", Subscriber: evil, ErrorCode: evil, Reason: evil, Error: evil,
			Message: broker.Message{ID: evil, Topic: evil, Key: evil, Headers: map[string]string{evil: evil}}}
	})
	_, err := b.Subscribe(evil, evil, ok)
	assert.NoError(t, err)
	h := newHandler(t, b, Options{AllowActions: true})
	// Attribute values (form fields, data attributes) keep the raw text,
	// so that filters and actions match; no text shown holds it.
	attrs := regexp.MustCompile(`="[^"]*"`)
	for _, target := range []string{"/", "/deadletters", "/deadletters/dl-0", "/deadletters?topic=" + url.QueryEscape(evil)} {
		page := getOK(t, h, target)
		shown := attrs.ReplaceAllString(page, `=""`)
		assert.False(t, strings.Contains(shown, rlo), "%s shows U+202E raw", target)
		assert.GreaterOrEqual(t, strings.Count(page, "bidi-[U&#43;202E]evil"), 2, "%s neutralises it", target)
	}
	assert.Equal(t, "a[U+2066]b[U+200F]c", neutral("a\u2066b\u200fc"))
	assert.Equal(t, "plain", neutral("plain"))
	assert.False(t, strings.ContainsFunc(neutral("\u202a\u202b\u202c\u202d\u202e\u2067\u2068\u2069\u200e\u061c"), isBidiControl))
}
