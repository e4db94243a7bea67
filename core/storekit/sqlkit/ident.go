package sqlkit

import (
	"fmt"
	"regexp"
)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidIdent reports why name cannot be used as the store's what
// ("table", "schema"), or nil: it must be non-empty, at most maxLen bytes,
// letters, digits and underscores, not starting with a digit.
//
// The rule is deliberately stricter than PostgreSQL and MySQL: names are
// quoted anyway (pgx.Identifier.Sanitize, backticks), but refusing odd
// characters keeps the names derived from them (partitions, sequences,
// token tables, procedures, indexes) predictable and greppable.
func ValidIdent(what, name string, maxLen int) error {
	switch {
	case name == "":
		return fmt.Errorf("%s name is empty", what)
	case len(name) > maxLen:
		return fmt.Errorf("%s name %q is longer than %d bytes", what, name, maxLen)
	case !identRE.MatchString(name):
		return fmt.Errorf("%s name %q must match %s", what, name, identRE)
	}
	return nil
}
