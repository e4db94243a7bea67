package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func loadHistory(t *testing.T, path string) []Op {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ops []Op
	if err := json.Unmarshal(b, &ops); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(ops) == 0 {
		t.Fatalf("%s: empty history", path)
	}
	return ops
}

// TestMysqlstoreClaimReadBack keeps the histories in which the model
// caught mysqlstore's claim procedure (migration 0003) answering from a
// read made after its COMMIT: between the two, an operator's Release (or a
// lapse and another request's takeover) changed the record, so the claim
// answered "claimed" with a record already failed, or answered "not
// claimed" after it had in fact taken the key under a token it never
// reported (an orphaned lease, held until it lapses). Checked as atomic
// claims, these histories are not linearizable: the checker must go on
// rejecting them, since TestMysqlstore checks mysqlstore's claims as
// atomic since migration 0006 (whose procedure reads its answer inside its
// transaction; mysqlstore's TestClaimAnswerReadInTx forces both
// interleavings). Checked as a write followed by a read (Op.ReadBack),
// they are linearizable: that was the whole defect.
func TestMysqlstoreClaimReadBack(t *testing.T) {
	files, err := filepath.Glob("testdata/mysqlstore-claim-readback-*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no saved histories: %v", err)
	}
	for _, f := range files {
		ops := loadHistory(t, f)
		if res, _ := Check(ops, time.Minute); res != porcupine.Illegal {
			t.Errorf("%s: atomic claims: %s, want %s", f, res, porcupine.Illegal)
		}
		for i := range ops {
			ops[i].ReadBack = ops[i].In.Kind == Claim
		}
		if res, _ := Check(ops, time.Minute); res != porcupine.Ok {
			t.Errorf("%s: claims as write then read: %s, want %s", f, res, porcupine.Ok)
		}
	}
}

// TestPgstoreClaimOvertakenHistories keeps the histories in which the
// model caught pgstore answering "not claimed" with a record the claim
// could take over (see TestPgstoreClaimOvertaken, which reproduces it
// deterministically): the model must go on rejecting them.
func TestPgstoreClaimOvertakenHistories(t *testing.T) {
	files, err := filepath.Glob("testdata/pgstore-claim-overtaken-*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no saved histories: %v", err)
	}
	for _, f := range files {
		if res, _ := Check(loadHistory(t, f), time.Minute); res != porcupine.Illegal {
			t.Errorf("%s: %s, want %s", f, res, porcupine.Illegal)
		}
	}
}
