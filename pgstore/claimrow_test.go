package pgstore

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/core/storekit"
)

// claimRowBytes encodes a composite in PostgreSQL's binary record format;
// nil values are NULL.
func claimRowBytes(oids []uint32, vals [][]byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(oids)))
	for i, oid := range oids {
		b = binary.BigEndian.AppendUint32(b, oid)
		if vals[i] == nil {
			b = binary.BigEndian.AppendUint32(b, 0xffffffff)
			continue
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(vals[i])))
		b = append(b, vals[i]...)
	}
	return b
}

func claimRowOIDs() []uint32 {
	oids := make([]uint32, len(claimRowColumns))
	for i, c := range claimRowColumns {
		oids[i] = c.oid
	}
	return oids
}

func pgTime(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(t.UnixMicro()-pgEpochMicros))
}

// completedRow is a replay's row: every column set.
func completedRow(now time.Time) [][]byte {
	return [][]byte{
		[]byte("tenant"), []byte("k1"), []byte("POST"), []byte("/pay"), []byte("f00d"),
		[]byte("completed"), binary.BigEndian.AppendUint64(nil, 42), pgTime(now), pgTime(now.Add(-time.Second)), pgTime(now.Add(time.Hour)),
		binary.BigEndian.AppendUint32(nil, 201), append([]byte{1}, `{"Content-Type":["application/json"]}`...), []byte(`{"id":1}`),
		{0}, {1}, {0}, pgTime(now),
	}
}

func TestDecodeClaimRow(t *testing.T) {
	now := time.Now().Truncate(time.Microsecond)
	req := &storekit.ClaimRequest{Scope: "tenant", Key: "k1", Method: "POST", Route: "/pay", Fingerprint: "f00d"}

	t.Run("replay", func(t *testing.T) {
		row, err := decodeClaimRow(claimRowBytes(claimRowOIDs(), completedRow(now)), req)
		if err != nil {
			t.Fatal(err)
		}
		r := row.rec
		if row.claimed || !row.hasPayload || !row.now.Equal(now) || r.Status != storekit.StatusCompleted || r.Token != 42 ||
			r.Scope != "tenant" || r.Fingerprint != "f00d" || !r.ExpiresAt.Equal(now.Add(time.Hour)) {
			t.Fatalf("decoded %+v", row)
		}
		if r.Response == nil || r.Response.Status != 201 || string(r.Response.Body) != `{"id":1}` ||
			r.Response.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("response %+v", r.Response)
		}
	})

	t.Run("fast path fills in the request", func(t *testing.T) {
		vals := make([][]byte, len(claimRowColumns))
		vals[6] = binary.BigEndian.AppendUint64(nil, 7)
		vals[7], vals[8], vals[9], vals[16] = pgTime(now), pgTime(now), pgTime(now), pgTime(now)
		vals[13], vals[14], vals[15] = []byte{0}, []byte{0}, []byte{1}
		row, err := decodeClaimRow(claimRowBytes(claimRowOIDs(), vals), req)
		if err != nil {
			t.Fatal(err)
		}
		r := row.rec
		if !row.claimed || r.Token != 7 || r.Status != storekit.StatusProcessing || r.Scope != "tenant" || r.Key != "k1" ||
			r.Method != "POST" || r.Route != "/pay" || r.Fingerprint != "f00d" || r.Response != nil {
			t.Fatalf("decoded %+v", row)
		}
	})

	// Whatever the bytes, an error and never a panic or a misread.
	good := claimRowBytes(claimRowOIDs(), completedRow(now))
	wrongOID := claimRowOIDs()
	wrongOID[6] = oidInt4
	shortToken := completedRow(now)
	shortToken[6] = []byte{0, 0, 0, 1}
	noToken := completedRow(now)
	noToken[6] = nil
	infinite := completedRow(now)
	infinite[7] = binary.BigEndian.AppendUint64(nil, 1<<63-1)
	badJSONB := completedRow(now)
	badJSONB[11] = []byte(`{}`)
	for name, tc := range map[string]struct {
		b    []byte
		want string
	}{
		"NULL":          {nil, "NULL"},
		"empty":         {[]byte{}, "truncated"},
		"column count":  {claimRowBytes(claimRowOIDs()[:3], completedRow(now)[:3]), "3 columns"},
		"truncated":     {good[:len(good)-3], "truncated"},
		"type":          {claimRowBytes(wrongOID, completedRow(now)), "column token has type OID 23"},
		"short value":   {claimRowBytes(claimRowOIDs(), shortToken), "token: 4 bytes"},
		"NULL token":    {claimRowBytes(claimRowOIDs(), noToken), "no token"},
		"infinite time": {claimRowBytes(claimRowOIDs(), infinite), "infinite"},
		"jsonb version": {claimRowBytes(claimRowOIDs(), badJSONB), "jsonb"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := decodeClaimRow(tc.b, req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func FuzzDecodeClaimRow(f *testing.F) {
	now := time.Now()
	f.Add(claimRowBytes(claimRowOIDs(), completedRow(now)))
	f.Add([]byte{0, 0, 0, 17})
	req := &storekit.ClaimRequest{Scope: "s", Key: "k"}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = decodeClaimRow(b, req) // must not panic
	})
}
