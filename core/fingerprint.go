package core

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"net/http"
	"sort"
	"strings"
	"unicode/utf8"
)

// FingerprintInput is what identifies "the same request" under one key.
type FingerprintInput struct {
	Method string
	Route  string
	Body   []byte
	// Header holds the request headers; only those named in Headers count.
	Header http.Header
	// Headers lists the header names that are part of the fingerprint.
	Headers []string
	// CanonicalJSON hashes the body as canonical JSON (object keys sorted,
	// insignificant whitespace removed) so that re-encoded retries match.
	// A body that is not valid JSON is hashed as raw bytes instead, so the
	// handler still sees it and answers (and that answer is stored).
	CanonicalJSON bool
}

// Fingerprint returns the hex SHA-256 of the request's identity: method,
// route template, selected headers and body. Every field is length-prefixed,
// so no two different inputs share an encoding.
func Fingerprint(in FingerprintInput) string {
	h := sha256.New()
	writeField(h, "idem-fp-v1")
	writeField(h, strings.ToUpper(in.Method))
	writeField(h, in.Route)
	if len(in.Headers) > 0 {
		names := make([]string, len(in.Headers))
		for i, n := range in.Headers {
			names[i] = http.CanonicalHeaderKey(n)
		}
		sort.Strings(names)
		for _, n := range names {
			writeField(h, n)
			vals := in.Header.Values(n)
			writeUint(h, uint64(len(vals)))
			for _, v := range vals {
				writeField(h, v)
			}
		}
	}
	if in.CanonicalJSON {
		if canon, ok := canonicalJSON(in.Body); ok {
			writeField(h, "json")
			writeBytes(h, canon)
			return hex.EncodeToString(h.Sum(nil))
		}
	}
	writeField(h, "raw")
	writeBytes(h, in.Body)
	return hex.EncodeToString(h.Sum(nil))
}

func writeUint(h hash.Hash, n uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	h.Write(b[:])
}

func writeField(h hash.Hash, s string) {
	writeUint(h, uint64(len(s)))
	h.Write([]byte(s))
}

func writeBytes(h hash.Hash, b []byte) {
	writeUint(h, uint64(len(b)))
	h.Write(b)
}

// canonicalJSON re-encodes body with sorted object keys and no insignificant
// whitespace. Numbers keep their literal text (json.Number), so 1.0 and 1 stay
// distinct and large integers are not rounded.
//
// Canonical form may only merge bodies that every JSON reader takes for the
// same value; anything else is reported as not canonical (ok false), so the
// body is fingerprinted as raw bytes and a retry must repeat it exactly:
//   - invalid UTF-8, and strings holding U+FFFD: encoding/json replaces each
//     invalid byte or lone surrogate escape (\ud800) with U+FFFD, which
//     would merge {"to":"\xff"} with {"to":"\xfe"};
//   - duplicate object keys: {"amount":1,"amount":5} would merge with
//     {"amount":5}, while a first-wins reader charges 1;
//   - nesting deeper than maxCanonicalDepth.
func canonicalJSON(body []byte) ([]byte, bool) {
	if !utf8.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	v, err := canonicalValue(dec, 0)
	if err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF { // trailing data: not one JSON value
		return nil, false
	}
	// encoding/json sorts map keys and escapes consistently.
	out, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	return out, true
}

const maxCanonicalDepth = 1000

var errNotCanonical = errors.New("not canonicalizable")

// canonicalValue reads one JSON value token by token, refusing what
// canonicalJSON must not merge.
func canonicalValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxCanonicalDepth {
		return nil, errNotCanonical
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok || strings.ContainsRune(k, utf8.RuneError) {
					return nil, errNotCanonical
				}
				if _, dup := obj[k]; dup {
					return nil, errNotCanonical
				}
				v, err := canonicalValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				obj[k] = v
			}
			if _, err := dec.Token(); err != nil { // '}'
				return nil, err
			}
			return obj, nil
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := canonicalValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			if _, err := dec.Token(); err != nil { // ']'
				return nil, err
			}
			return arr, nil
		}
		return nil, errNotCanonical
	case string:
		if strings.ContainsRune(t, utf8.RuneError) {
			return nil, errNotCanonical
		}
		return t, nil
	default: // json.Number, bool, nil
		return t, nil
	}
}
