package pgstore

import (
	"errors"

	"log/slog"

	"github.com/jackc/pgx/v5"
)

// Where the wait-mode listener (watch.go) connects. LISTEN needs a session
// of its own for as long as it listens; a transaction-pooling proxy
// (PgBouncer pool_mode=transaction, and most managed poolers) hands the
// server connection to another client after every transaction, so a LISTEN
// sent through it stops hearing anything at once. Behind such a pooler the
// listener must connect to PostgreSQL directly, or waiting duplicates poll.

type listenConfig struct {
	connString string // WithListenConnString
	pooler     bool   // WithTransactionPooler
	logger     *slog.Logger
}

// errNoListener: behind a transaction pooler without a direct connection
// string; Watch returns no channel and the engine polls.
var errNoListener = errors.New("pgstore: watch: no direct connection for LISTEN behind a transaction pooler (WithListenConnString); polling")

// WithListenConnString sets the connection string of the one connection a
// Store opens to LISTEN for wake-ups of waiting duplicates (core.WithWait),
// when the pool does not reach PostgreSQL directly: behind a
// transaction-pooling proxy, give the primary's direct address here (a
// multi-host string with target_session_attrs=read-write follows a
// failover). It is parsed by New.
//
// Default: "", the pool's own connection settings.
func WithListenConnString(s string) Option {
	return optionFunc(func(c *config) {
		if s == "" {
			c.errs = append(c.errs, errors.New("listen connection string is empty"))
			return
		}
		c.listen.connString = s
	})
}

// WithTransactionPooler declares that the pool reaches PostgreSQL through a
// transaction-pooling proxy (PgBouncer pool_mode=transaction). Everything
// but LISTEN works through one (see the README, "Deploying"); LISTEN then
// uses WithListenConnString, and without it waiting duplicates poll
// (core.WithWaitPoll) — New logs that once, at warning level, on the
// WithLogger logger.
//
// Default: off (the pool is assumed to reach PostgreSQL directly, or
// through a session pooler).
func WithTransactionPooler() Option {
	return optionFunc(func(c *config) { c.listen.pooler = true })
}

// WithLogger sets where the store logs what an operator should know about
// its set-up (so far: the wait-mode fallback to polling). It never logs
// keys. A nil logger is ignored.
//
// Default: no logging.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.listen.logger = l
		}
	})
}

// initListen prepares the listener's connection settings (New).
func (s *Store) initListen() error {
	lc := s.cfg.listen
	log := lc.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch {
	case lc.connString != "":
		cc, err := pgx.ParseConfig(lc.connString)
		if err != nil {
			// pgx may quote the string, password included: say less.
			return errors.New("pgstore: new: WithListenConnString: not a valid PostgreSQL connection string")
		}
		s.listenConn = cc
		log.Info("pgstore: wait mode listens on its own direct connection",
			"host", cc.Host, "port", cc.Port, "database", cc.Database)
	case lc.pooler:
		log.Warn("pgstore: behind a transaction pooler without WithListenConnString: " +
			"duplicates waiting for an in-flight request (core.WithWait) poll instead of being woken by LISTEN/NOTIFY")
	default:
		s.listenConn = s.pool.Config().ConnConfig
	}
	return nil
}

// listenConfig returns a copy of the listener's connection settings, or
// errNoListener.
func (s *Store) listenConnConfig() (*pgx.ConnConfig, error) {
	if s.listenConn == nil {
		return nil, errNoListener
	}
	return s.listenConn.Copy(), nil
}
