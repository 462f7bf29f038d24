package admin

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestFormats pins the formats static/app.js repeats (keep both alike).
func TestFormats(t *testing.T) {
	r := 2.54
	tests := []struct{ got, want string }{
		{fmtAge(0), "0"},
		{fmtAge(-1), "0"},
		{fmtAge(0.35), "350ms"},
		{fmtAge(4.2), "4.2s"},
		{fmtAge(187), "3m07s"},
		{fmtAge(7500), "2h05m"},
		{fmtRate(nil), "–"},
		{fmtRate(&r), "2.5/s"},
		{fmtPct(0.05), "5.0%"},
		{fmtBreaker(""), "–"},
		{fmtBreaker("open"), "open"},
		{fmtBytes(65536), "65,536"},
		{fmtBytes(999), "999"},
		{cut(3, "abcdef"), "abc…"},
		{cut(3, "日本語です"), "日本語…"},
		{cut(3, "abc"), "abc"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.got)
	}
}

func TestPathEscape(t *testing.T) {
	tests := map[string]string{
		"dl-1_a.b~c": "dl-1_a.b~c",
		"a/b":        "a%2Fb",
		"q?x=1&y":    "q%3Fx%3D1%26y",
		"h#f":        "h%23f",
		"sp ace":     "sp%20ace",
		"100%":       "100%25",
		".":          "%2E",
		"..":         "%2E%2E",
		"...":        "...",
		"j:x":        "j%3Ax",
		"<b>":        "%3Cb%3E",
		"ü":          "%C3%BC",
	}
	for in, want := range tests {
		assert.Equal(t, want, pathEscape(in), in)
	}
}
