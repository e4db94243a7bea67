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
	"sync"
	"unicode/utf8"
)

// fingerprintInput is what identifies "the same request" under one key.
type fingerprintInput struct {
	Method string
	Route  string
	// Target is the request target as received (path and query). Without
	// it, one key sent to /orders/1/confirm and then /orders/2/confirm
	// would share the route template and replay order 1's answer.
	// Empty means not part of the fingerprint.
	Target string
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

// fingerprint returns the hex SHA-256 of the request's identity: method,
// route template, request target, selected headers and body. Every field is length-prefixed,
// so no two different inputs share an encoding.
func fingerprint(in fingerprintInput) string {
	x := newHasher()
	defer x.release()
	x.field("idem-fp-v1")
	x.field(strings.ToUpper(in.Method))
	x.field(in.Route)
	if in.Target != "" {
		x.field("target")
		x.field(in.Target)
	}
	if len(in.Headers) > 0 {
		names := make([]string, len(in.Headers))
		for i, n := range in.Headers {
			names[i] = http.CanonicalHeaderKey(n)
		}
		sort.Strings(names)
		for _, n := range names {
			x.field(n)
			vals := in.Header.Values(n)
			x.uint(uint64(len(vals)))
			for _, v := range vals {
				x.field(v)
			}
		}
	}
	if in.CanonicalJSON {
		if canon, ok := canonicalJSON(in.Body); ok {
			x.field("json")
			x.bytes(canon)
			return x.hexSum("", sha256.Size)
		}
	}
	x.field("raw")
	x.bytes(in.Body)
	return x.hexSum("", sha256.Size)
}

// hasher feeds length-prefixed fields to a SHA-256. Small fields are
// gathered in buf and written in one call; a large body is written
// directly, never copied. Hashers are pooled: a fingerprint then costs one
// allocation, its result string.
type hasher struct {
	h   hash.Hash
	buf []byte
}

// inlineBytes is the largest byte field copied into the buffer rather than
// written to the hash on its own.
const inlineBytes = 1024

var hasherPool = sync.Pool{New: func() any {
	return &hasher{h: sha256.New(), buf: make([]byte, 0, 2*inlineBytes)}
}}

func newHasher() *hasher { return hasherPool.Get().(*hasher) }

func (x *hasher) release() {
	x.h.Reset()
	if cap(x.buf) > 64<<10 { // do not keep a huge route or header around
		x.buf = make([]byte, 0, 2*inlineBytes)
	}
	x.buf = x.buf[:0]
	hasherPool.Put(x)
}

func (x *hasher) uint(n uint64) { x.buf = binary.BigEndian.AppendUint64(x.buf, n) }

func (x *hasher) field(s string) {
	x.uint(uint64(len(s)))
	x.buf = append(x.buf, s...)
}

func (x *hasher) bytes(b []byte) {
	x.uint(uint64(len(b)))
	if len(b) <= inlineBytes {
		x.buf = append(x.buf, b...)
		return
	}
	x.flush()
	x.h.Write(b)
}

func (x *hasher) flush() {
	if len(x.buf) > 0 {
		x.h.Write(x.buf)
		x.buf = x.buf[:0]
	}
}

// hexSum returns prefix followed by the hex encoding of the first n bytes
// of the digest (n <= sha256.Size, len(prefix) <= 16).
func (x *hasher) hexSum(prefix string, n int) string {
	x.flush()
	sum := x.h.Sum(x.buf[:0])
	var out [16 + 2*sha256.Size]byte
	p := copy(out[:], prefix)
	hex.Encode(out[p:], sum[:n])
	return string(out[:p+2*n])
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
