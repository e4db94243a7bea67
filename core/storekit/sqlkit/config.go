package sqlkit

import (
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// defaultTable is the records table unless WithTable says otherwise.
const defaultTable = "idem_records"

// Config is the part of a store's options the database/sql stores take
// alike. Each store embeds it in its own config and sets it through its
// own Option functions (their documentation is the store's).
type Config struct {
	// Table is the records table (WithTable); other tables' names are
	// derived from it.
	Table string
	// Margin is how long past retention a record is kept before Sweep
	// deletes it (WithRetentionMargin).
	Margin time.Duration
	// TxDB is the pool Tx begins transactions on (WithTxPool); nil for
	// the store's own.
	TxDB *sql.DB
	// TxOpts are the options of Tx's transactions (WithTxOptions).
	TxOpts *sql.TxOptions

	// ClockOffset shifts the database clock the store reads. Tests only:
	// it drives a record past retention without waiting. Zero in
	// production.
	ClockOffset time.Duration

	// Errs collects the options' refusals, for Valid.
	Errs []error
}

// NewConfig is the default configuration: the table idem_records and
// margin.
func NewConfig(margin time.Duration) Config {
	return Config{Table: defaultTable, Margin: margin}
}

// SetMargin is WithRetentionMargin: a negative margin is refused.
func (c *Config) SetMargin(d time.Duration) {
	if d < 0 {
		c.Errs = append(c.Errs, fmt.Errorf("retention margin %v is negative", d))
		return
	}
	c.Margin = d
}

// SetTxDB is the option naming the pool Tx begins transactions on: nil is
// refused.
func (c *Config) SetTxDB(db *sql.DB) {
	if db == nil {
		c.Errs = append(c.Errs, errors.New("tx db is nil"))
		return
	}
	c.TxDB = db
}

// TxMarked reports whether Tx's transactions carry a commit mark: all but
// a read-only one (WithTxOptions), which has no writes to mark.
func (c *Config) TxMarked() bool { return c.TxOpts == nil || !c.TxOpts.ReadOnly }

// Valid joins the options' refusals and the table name's check
// (ValidIdent, at most maxTableLen bytes), under "<pkg>: invalid options".
func (c *Config) Valid(pkg string, maxTableLen int) error {
	errs := c.Errs
	if err := ValidIdent("table", c.Table, maxTableLen); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: invalid options: %w", pkg, err)
	}
	return nil
}
