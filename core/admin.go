package core

import "github.com/idemkit/idem/core/internal/redact"

// RedactKey is how idem shows a key wherever it must not appear in clear
// (logs, errors, tools' output): a short hash, enough to correlate, useless
// to replay a request. Store and tool authors scrub text from elsewhere with
// storekit.ScrubText.
func RedactKey(key string) string { return redact.Key(key) }
