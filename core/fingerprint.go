package core

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash"
	"net/http"
	"sort"
	"strings"
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
func canonicalJSON(body []byte) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if dec.More() { // trailing data: not one JSON value
		return nil, false
	}
	if _, err := dec.Token(); err == nil {
		return nil, false
	}
	// encoding/json sorts map keys and escapes consistently.
	out, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	return out, true
}
