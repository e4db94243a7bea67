package completer

import (
	"context"
	"time"

	"github.com/idemkit/idem/core/internal/rerun"
)

// WithMark marks ctx as a completer's re-run of the record (scope, born).
func WithMark(ctx context.Context, scope string, born time.Time) context.Context {
	return rerun.With(ctx, rerun.Mark{Scope: scope, Born: born})
}
