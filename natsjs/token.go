package natsjs

import (
	"crypto/sha256"
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
