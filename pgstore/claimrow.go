package pgstore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// The claim function of migration 0004 returns one composite value, which
// the store asks for in PostgreSQL's binary format and decodes here: a
// column count, then per column its type OID, its length (-1 for NULL) and
// its bytes in the type's binary form. Decoding by hand costs a few
// comparisons per column where pgx's generic Scan plans every destination
// on every call (BENCHMARKS.md §2). Every OID is checked: a value of an
// unexpected type is an error, never a misread.

// claimRowColumns is the shape of the composite type of migration 0004.
var claimRowColumns = [...]struct {
	name string
	oid  uint32
}{
	{"scope", oidText}, {"key", oidText}, {"method", oidText}, {"route", oidText}, {"fingerprint", oidText},
	{"status", oidText}, {"token", oidInt8}, {"locked_until", oidTimestamptz},
	{"created_at", oidTimestamptz}, {"expires_at", oidTimestamptz},
	{"resp_status", oidInt4}, {"resp_header", oidJSONB}, {"resp_body", oidBytea},
	{"resp_not_retained", oidBool}, {"has_payload", oidBool},
	{"claimed", oidBool}, {"now", oidTimestamptz},
}

// PostgreSQL's built-in type OIDs (pg_type.dat; stable across versions).
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt4        = 23
	oidText        = 25
	oidTimestamptz = 1184
	oidJSONB       = 3802
)

// claimRow is the decoded composite. On the claim's fast path the columns
// the caller sent (scope ... status) are NULL (nil).
type claimRow struct {
	rec        storekit.Record
	hasPayload bool
	claimed    bool
	now        time.Time
	// created: the claim certainly created the record, because it did so
	// by inserting it (the bare insert, a batch, the function's fast path).
	created bool
}

// fresh reports whether this claim created the record (ClaimResult.Fresh),
// only where that is certain. A record the claim function's slow path
// claimed was either re-created (expired) or taken over, and created_at
// does not tell which: a takeover keeps the old created_at, which equals
// the statement's clock when the old claim's transaction began in the same
// microsecond (the model checker found it: two claims of one key started
// together, a lapse between them). Fresh is then false, which
// costs a read of the steps at the first Step, never a skipped one.
func (cr *claimRow) fresh() bool { return cr.claimed && cr.created }

// decodeClaimRow decodes the binary composite b; req supplies the columns
// the fast path leaves NULL. Strings and the body are copied: b is pgx's
// read buffer.
func decodeClaimRow(b []byte, req *storekit.ClaimRequest) (claimRow, error) {
	var (
		out      claimRow
		col      [len(claimRowColumns)][]byte
		null     [len(claimRowColumns)]bool
		n        int
		overflow = errors.New("truncated composite value")
	)
	if b == nil {
		return out, errors.New("claim function returned NULL")
	}
	if len(b) < 4 {
		return out, overflow
	}
	if n = int(int32(binary.BigEndian.Uint32(b))); n != len(claimRowColumns) {
		return out, fmt.Errorf("claim function returned %d columns, want %d (schema and binary disagree: run pgstore.Migrate)", n, len(claimRowColumns))
	}
	b = b[4:]
	for i, c := range claimRowColumns {
		if len(b) < 8 {
			return out, overflow
		}
		oid, size := binary.BigEndian.Uint32(b), int32(binary.BigEndian.Uint32(b[4:]))
		b = b[8:]
		if oid != c.oid {
			return out, fmt.Errorf("claim function column %s has type OID %d, want %d (schema and binary disagree: run pgstore.Migrate)", c.name, oid, c.oid)
		}
		if size < 0 {
			null[i] = true
			continue
		}
		if int(size) > len(b) {
			return out, overflow
		}
		col[i], b = b[:size], b[size:]
	}

	var err error
	text := func(i int, fallback string) string {
		if null[i] {
			return fallback
		}
		return string(col[i])
	}
	fixed := func(i, size int) ([]byte, bool) {
		if null[i] {
			return nil, false
		}
		if len(col[i]) != size {
			err = errors.Join(err, fmt.Errorf("claim function column %s: %d bytes, want %d", claimRowColumns[i].name, len(col[i]), size))
			return nil, false
		}
		return col[i], true
	}
	boolean := func(i int) bool {
		v, ok := fixed(i, 1)
		return ok && v[0] != 0
	}
	timestamp := func(i int) time.Time {
		v, ok := fixed(i, 8)
		if !ok {
			return time.Time{}
		}
		us := int64(binary.BigEndian.Uint64(v))
		if us == math.MaxInt64 || us == math.MinInt64 {
			err = errors.Join(err, fmt.Errorf("claim function column %s: infinite timestamp", claimRowColumns[i].name))
			return time.Time{}
		}
		return time.UnixMicro(us + pgEpochMicros)
	}

	out.claimed = boolean(15)
	out.created = out.claimed && null[0] // the fast path's NULLs
	out.hasPayload = boolean(14)
	out.now = timestamp(16)
	r := &out.rec
	if out.claimed {
		// Fast path: what the caller sent, status processing. (The slow path
		// returns every column, also when it claimed by takeover.)
		r.Scope, r.Key, r.Method, r.Route, r.Fingerprint = text(0, req.Scope), text(1, req.Key),
			text(2, req.Method), text(3, req.Route), text(4, req.Fingerprint)
		r.Status = storekit.Status(text(5, string(storekit.StatusProcessing)))
	} else {
		r.Scope, r.Key, r.Method, r.Route, r.Fingerprint = text(0, ""), text(1, ""), text(2, ""), text(3, ""), text(4, "")
		r.Status = storekit.Status(text(5, ""))
	}
	if v, ok := fixed(6, 8); ok {
		r.Token = int64(binary.BigEndian.Uint64(v))
	} else if err == nil {
		err = errors.New("claim function returned no token")
	}
	r.LockedUntil, r.CreatedAt, r.ExpiresAt = timestamp(7), timestamp(8), timestamp(9)
	if r.Status == storekit.StatusCompleted && out.hasPayload {
		if v, ok := fixed(10, 4); ok {
			resp := &storekit.StoredResponse{
				Status:      int(int32(binary.BigEndian.Uint32(v))),
				Body:        bytesOf(col[12], null[12]),
				NotRetained: boolean(13),
			}
			if h := col[11]; !null[11] {
				if len(h) < 1 || h[0] != 1 {
					return out, errors.Join(err, errors.New("claim function column resp_header: unknown jsonb binary version"))
				}
				if h = h[1:]; len(h) > 0 {
					var hdr map[string][]string
					if perr := json.Unmarshal(h, &hdr); perr != nil {
						return out, errors.Join(err, fmt.Errorf("decode stored headers: %w", perr))
					}
					resp.Header = hdr
				}
			}
			r.Response = resp
		}
	}
	return out, err
}

// bytesOf copies a bytea column: nil for NULL, never nil otherwise (an
// empty body is a body).
func bytesOf(b []byte, null bool) []byte {
	if null {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// pgEpochMicros is PostgreSQL's epoch (2000-01-01 UTC) in Unix
// microseconds: binary timestamps count from it.
const pgEpochMicros = 946684800 * 1_000_000
