package core

import (
	"strings"
)

// parseKey extracts the idempotency key from the values of its header lines.
//
// The IETF draft defines the header as a Structured Field String
// (RFC 8941: `"..."` with `\"` and `\\` escapes); many clients send the raw
// token instead (`Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324`), so
// both are accepted. The key must be 1 to MaxKeyBytes printable ASCII bytes.
// Several header lines, or one line holding a list, are refused: which one the
// client meant is ambiguous.
func parseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", keyErr("several header lines")
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", keyErr("empty")
	}
	if len(v) > 2*MaxKeyBytes+2 { // fail fast on huge input before scanning it
		return "", keyErr("longer than 255 bytes")
	}
	var key string
	if v[0] == '"' {
		k, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		key = k
	} else {
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c <= 0x20 || c >= 0x7f {
				return "", keyErr("contains a non-printable, non-ASCII or space character")
			}
			if c == '"' || c == ',' || c == '\\' {
				return "", keyErr(`unquoted key contains '"', ',' or '\'`)
			}
		}
		key = v
	}
	if key == "" {
		return "", keyErr("empty")
	}
	if len(key) > MaxKeyBytes {
		return "", keyErr("longer than 255 bytes")
	}
	return key, nil
}

func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", keyErr(`invalid escape in quoted key (only \" and \\ are allowed)`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", keyErr("data after the closing quote (parameters and lists are not accepted)")
			}
			return b.String(), nil
		case c < 0x20 || c >= 0x7f:
			return "", keyErr("contains a non-printable or non-ASCII character")
		default:
			b.WriteByte(c)
		}
	}
	return "", keyErr("unterminated quoted key")
}

type keyError struct{ msg string }

func (e *keyError) Error() string { return "idem: idempotency key invalid: " + e.msg }
func (e *keyError) Unwrap() error { return ErrKeyInvalid }

func keyErr(msg string) error { return &keyError{msg: msg} }
