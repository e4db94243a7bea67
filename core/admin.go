package core

import (
	"crypto/sha256"
	"encoding/hex"
)

// RedactKey is how idem shows a key wherever it must not appear in clear
// (logs, errors, tools' output): a short hash, enough to correlate, useless
// to replay a request.
func RedactKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:6])
}
