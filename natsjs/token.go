package natsjs

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"fmt"
	"strings"
)

// maxPlainName is the longest name (in bytes) that token encodes whole;
// longer ones are hashed, so that a subject or key stays short whatever the
// names (NATS limits a subject by the control line, 4 KiB by default).
const maxPlainName = 48

// token encodes a topic, subscriber, error code, message ID or dead-letter
// ID as one subject token (and KV key token): "n" and the name in
// unpadded base64url if it is at most maxPlainName bytes, else "h" and the
// base64url SHA-256 of the name. Both alphabets are safe in subjects and KV
// keys (no '.', '*', '>' or space); the leading letter keeps the two forms
// apart and makes the token of the empty name ("n") non-empty. Names that
// are hashed can collide only with a SHA-256 collision; readers compare the
// decoded names anyway.
func token(name string) string {
	if len(name) <= maxPlainName {
		return "n" + base64.RawURLEncoding.EncodeToString([]byte(name))
	}
	sum := sha256.Sum256([]byte(name))
	return "h" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// validSubjectPrefix reports why p cannot prefix the dead-letter subjects:
// dot-separated tokens, none empty, without wildcards or whitespace.
func validSubjectPrefix(p string) error {
	if p == "" {
		return fmt.Errorf("%w: empty subject prefix", ErrInvalidOption)
	}
	for tok := range strings.SplitSeq(p, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("%w: subject prefix %q: tokens must be non-empty, without wildcards or whitespace", ErrInvalidOption, p)
		}
	}
	return nil
}

// validName reports why name cannot name a stream or a KV bucket: the
// characters JetStream accepts in both are letters, digits, '-' and '_'.
func validName(what, name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("%w: %s name %q: want 1 to 64 characters", ErrInvalidOption, what, name)
	}
	for _, r := range name {
		if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return fmt.Errorf("%w: %s name %q: only letters, digits, '-' and '_'", ErrInvalidOption, what, name)
		}
	}
	return nil
}

// maxPlainTopicName is the longest topic or subscriber name (in bytes)
// that nameToken keeps as it is.
const maxPlainTopicName = 48

// maxEncodedTopicName is the longest name nameToken encodes in base32
// rather than hashing it.
const maxEncodedTopicName = 30

// lowerBase32 is base32 with the extended-hex alphabet in lower case and
// no padding: digits and a-v only.
var lowerBase32 = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// nameToken encodes a topic or subscriber name for the transport's stream
// names, consumer names and subject tokens, all of which JetStream also
// uses as file names: so the result is lower case (two names never meet on
// a case-insensitive file system), at most 50 bytes, and made of a-z, 0-9,
// '_' and '-' only.
//
//   - a name of 1 to 48 bytes of a-z, 0-9, '_' and '-' that starts with a
//     letter or digit is kept as it is ("orders", "order_created");
//   - another name of at most 30 bytes is "_b" and its base32;
//   - a longer one is "_h" and the base32 of the first 20 bytes of its
//     SHA-256.
//
// A kept name never starts with '_', so the three forms cannot meet.
func nameToken(name string) string {
	if plainTopicName(name) {
		return name
	}
	if len(name) <= maxEncodedTopicName {
		return "_b" + lowerBase32.EncodeToString([]byte(name))
	}
	sum := sha256.Sum256([]byte(name))
	return "_h" + lowerBase32.EncodeToString(sum[:20])
}

func plainTopicName(name string) bool {
	if name == "" || len(name) > maxPlainTopicName || name[0] == '-' || name[0] == '_' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
