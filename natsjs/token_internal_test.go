package natsjs

import (
	"regexp"
	"strings"
	"testing"
)

var tokenRe = regexp.MustCompile(`^[nh][A-Za-z0-9_-]*$`)

func TestToken(t *testing.T) {
	names := []string{
		"", "a", "A", "orders", "orders.eu", "orders.*", "orders.>", " ", "a b", "\x00", "ü", "caf\u00e9", "cafe\u0301",
		"n", "h", "nYQ", strings.Repeat("x", maxPlainName), strings.Repeat("x", maxPlainName+1), strings.Repeat("x", 5000),
	}
	seen := map[string]string{}
	for _, name := range names {
		tok := token(name)
		if !tokenRe.MatchString(tok) {
			t.Errorf("token(%q) = %q: not a safe subject token", name, tok)
		}
		if len(tok) > 1+(maxPlainName*4+2)/3 {
			t.Errorf("token of a %d-byte name is %d bytes", len(name), len(tok))
		}
		if other, ok := seen[tok]; ok {
			t.Errorf("token(%q) = token(%q) = %q", name, other, tok)
		}
		seen[tok] = name
	}
	if token("x") != token("x") {
		t.Errorf("token is not deterministic")
	}
}

func TestValidNames(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"BRK_DLQ", true}, {"a-b_c9", true}, {"", false}, {"a.b", false}, {"a b", false}, {"a*", false}, {"a/b", false},
		{strings.Repeat("a", 64), true}, {strings.Repeat("a", 65), false},
	} {
		if err := validName("stream", c.name); (err == nil) != c.ok {
			t.Errorf("validName(%q) = %v, want ok %v", c.name, err, c.ok)
		}
	}
	for _, c := range []struct {
		prefix string
		ok     bool
	}{
		{"brk.dlq", true}, {"x", true}, {"", false}, {".a", false}, {"a.", false}, {"a..b", false}, {"a.*", false}, {"a.>", false}, {"a b", false},
	} {
		if err := validSubjectPrefix(c.prefix); (err == nil) != c.ok {
			t.Errorf("validSubjectPrefix(%q) = %v, want ok %v", c.prefix, err, c.ok)
		}
	}
}
