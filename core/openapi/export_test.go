package openapi

// KeyPattern is the published key header pattern, for the tests that check
// it against the engine's key parser.
const KeyPattern = keyPattern
