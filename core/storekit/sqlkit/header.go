package sqlkit

import (
	"encoding/binary"
	"errors"
	"net/http"
)

// headerFormatV1 is the first byte of the stored header format.
const headerFormatV1 = 1

// AppendHeader appends h to b in the format the stores keep stored
// response headers in (the resp_header column ScanRecord reads back) and
// returns the extended slice. The format is binary, not JSON: a handler
// may set header values that are not valid UTF-8 or hold NUL, and a BLOB
// keeps every byte as it was (MySQL's JSON type, like PostgreSQL's jsonb,
// or JSON text in SQLite, would not). Layout, all lengths as uvarints:
//
//	version byte (1)
//	number of names
//	per name: len, name bytes, number of values, per value: len, value bytes
//
// ResponseBlobs calls it; a store that writes the column itself may too.
func AppendHeader(b []byte, h http.Header) []byte {
	b = append(b, headerFormatV1)
	b = binary.AppendUvarint(b, uint64(len(h)))
	for name, vals := range h {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

var errBadHeader = errors.New("stored headers are malformed")

// parseHeader decodes what AppendHeader wrote; anything else is
// errBadHeader.
func parseHeader(b []byte) (http.Header, error) {
	if len(b) == 0 || b[0] != headerFormatV1 {
		return nil, errBadHeader
	}
	b = b[1:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	str := func() (string, bool) {
		l, ok := next()
		if !ok || l > uint64(len(b)) {
			return "", false
		}
		s := string(b[:l])
		b = b[l:]
		return s, true
	}
	count, ok := next()
	if !ok || count > uint64(len(b)) { // every name takes at least one byte
		return nil, errBadHeader
	}
	h := make(http.Header, count)
	for range count {
		name, ok := str()
		if !ok {
			return nil, errBadHeader
		}
		nv, ok := next()
		if !ok || nv > uint64(len(b)) {
			return nil, errBadHeader
		}
		vals := make([]string, 0, nv)
		for range nv {
			v, ok := str()
			if !ok {
				return nil, errBadHeader
			}
			vals = append(vals, v)
		}
		h[name] = vals
	}
	if len(b) != 0 {
		return nil, errBadHeader
	}
	return h, nil
}
