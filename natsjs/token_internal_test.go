package natsjs

import (
	"hash/fnv"
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

var nameTokenRe = regexp.MustCompile(`^[a-z0-9_-]{1,50}$`)

// TestNameToken: stream, consumer and subject names from any topic or
// subscriber name are lower case, short, distinct, and plain names are kept.
func TestNameToken(t *testing.T) {
	names := []string{
		"orders", "Orders", "ORDERS", "orders.eu", "orders_eu", "orders-eu", "a b", "*", ">", "", "_x", "-y", "x_", "0",
		"ünï", "\x00", "\r\n", strings.Repeat("a", 48), strings.Repeat("a", 49), strings.Repeat("A", 30), strings.Repeat("A", 31),
		strings.Repeat("x", 5000), "_bmfzxg", "_h0", lowerBase32.EncodeToString([]byte("Orders")),
	}
	seen := map[string]string{}
	for _, name := range names {
		tok := nameToken(name)
		if !nameTokenRe.MatchString(tok) {
			t.Errorf("nameToken(%q) = %q: want 1 to 50 of a-z 0-9 _ -", name, tok)
		}
		if other, ok := seen[tok]; ok {
			t.Errorf("nameToken(%q) = nameToken(%q) = %q", name, other, tok)
		}
		seen[tok] = name
	}
	for _, plain := range []string{"orders", "order_created", "a-b", "9"} {
		if got := nameToken(plain); got != plain {
			t.Errorf("nameToken(%q) = %q, want it kept", plain, got)
		}
	}
}

// TestHeaderEncoding: the broker's fields survive the headers whatever
// they hold, and plain values are left readable.
func TestHeaderEncoding(t *testing.T) {
	for _, s := range []string{"order-1", "", " lead", "trail ", `"quoted"`, "a\r\nInjected: yes", "ünï", "\xff\xfe", "tab\tx", "a:b"} {
		v := headerValue(s)
		if strings.ContainsAny(v, "\r\n") {
			t.Errorf("headerValue(%q) = %q: a line break", s, v)
		}
		if got, err := parseHeaderValue(v); err != nil || got != s {
			t.Errorf("parseHeaderValue(headerValue(%q)) = %q, %v", s, got, err)
		}
	}
	if v := headerValue("order-1"); v != "order-1" {
		t.Errorf("headerValue(order-1) = %q, want it as it is", v)
	}
	hs := map[string]string{"traceparent": "00-ab-cd-01", "": "empty name", "a\"b": "c,d:e", "ü": "\xff\r\n", "k": ""}
	enc := encodeUserHeaders(hs)
	if strings.ContainsAny(enc, "\r\n") {
		t.Errorf("encodeUserHeaders = %q: a line break", enc)
	}
	got, err := decodeUserHeaders(enc)
	if err != nil || len(got) != len(hs) {
		t.Fatalf("decodeUserHeaders(%q) = %v, %v", enc, got, err)
	}
	for k, v := range hs {
		if got[k] != v {
			t.Errorf("header %q = %q, want %q", k, got[k], v)
		}
	}
	for _, bad := range []string{`"a"`, `"a":`, `"a":"b"x`, `a:"b"`, `"a":"b",`} {
		if _, err := decodeUserHeaders(bad); err == nil {
			t.Errorf("decodeUserHeaders(%q): no error", bad)
		}
	}
}

func TestPartition(t *testing.T) {
	if Partition("k", "a", 1) != 0 || Partition("", "a", 0) != 0 {
		t.Error("one partition (or none) is partition 0")
	}
	// Fixed values: every process, every version, must agree.
	for _, c := range []struct {
		key, id string
		n, want int
	}{
		{"customer-7", "x", 4, int(fnv32a("customer-7") % 4)},
		{"", "order-1", 8, int(fnv32a("order-1") % 8)},
		{"a", "", 256, 44},
	} {
		if got := Partition(c.key, c.id, c.n); got != c.want {
			t.Errorf("Partition(%q, %q, %d) = %d, want %d", c.key, c.id, c.n, got, c.want)
		}
	}
	if Partition("same", "a", 16) != Partition("same", "b", 16) {
		t.Error("messages of one Key in different partitions")
	}
}

func fnv32a(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
